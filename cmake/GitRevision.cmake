# Writes generated/scalelab/version.h with the source tree's git revision, at every build (not only
# at configure time: an incremental build after a commit must not print, record and compare the
# revision it was configured at). "-dirty" marks a build of a tree whose tracked files differ from
# HEAD. configure_file rewrites the header only when its text changes, so an unchanged revision
# recompiles nothing.
#   cmake -DSRC_DIR=... -DIN=... -DOUT=... -DPROJECT_VERSION=... -P cmake/GitRevision.cmake
execute_process(COMMAND git rev-parse --short=12 HEAD
  WORKING_DIRECTORY ${SRC_DIR}
  OUTPUT_VARIABLE SCALELAB_GIT_REV OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT SCALELAB_GIT_REV)
  set(SCALELAB_GIT_REV "unknown")
else()
  execute_process(COMMAND git diff --quiet HEAD --
    WORKING_DIRECTORY ${SRC_DIR} RESULT_VARIABLE dirty OUTPUT_QUIET ERROR_QUIET)
  if(dirty EQUAL 1)
    string(APPEND SCALELAB_GIT_REV "-dirty")
  endif()
endif()
configure_file(${IN} ${OUT} @ONLY)
