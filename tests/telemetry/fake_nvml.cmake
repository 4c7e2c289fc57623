# The fake libnvidia-ml the telemetry tests dlopen (see fake_nvml.c): built in full and with the
# optional symbols left out. The test binary gets their paths as compile definitions.
foreach(variant fake_nvml fake_nvml_minimal)
  add_library(${variant} SHARED ${CMAKE_CURRENT_LIST_DIR}/fake_nvml.c)
  target_compile_options(${variant} PRIVATE ${SCALELAB_WARNINGS} -fvisibility=hidden)
  set_target_properties(${variant} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests/telemetry)
endforeach()
target_compile_definitions(fake_nvml_minimal PRIVATE FAKE_NVML_MINIMAL)

if(TARGET scalelab_telemetry_tests)
  add_dependencies(scalelab_telemetry_tests fake_nvml fake_nvml_minimal)
  target_compile_definitions(scalelab_telemetry_tests PRIVATE
    FAKE_NVML_LIB="$<TARGET_FILE:fake_nvml>"
    FAKE_NVML_MINIMAL_LIB="$<TARGET_FILE:fake_nvml_minimal>"
    FAKE_NVIDIA_SMI="${CMAKE_CURRENT_LIST_DIR}/fake_nvidia_smi.py")
endif()

# The train command's --telemetry is tested end to end against the fake library too.
if(TARGET scalelab_cli_tests)
  add_dependencies(scalelab_cli_tests fake_nvml)
  target_compile_definitions(scalelab_cli_tests PRIVATE FAKE_NVML_LIB="$<TARGET_FILE:fake_nvml>")
endif()
