// Regression tests of the fuzz findings (docs/reliability.md, "Findings"): each input that made a
// parser crash, hit undefined behaviour or exhaust memory is committed under
// tests/fuzz/corpus/<target>/ (crash-*: found by libFuzzer; found-*: found by hand through the
// harness) and must now be refused with InvalidInput naming the file — and, through the binary,
// with exit 2.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "fuzz/targets.h"

namespace scalelab::fuzz {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::vector<std::uint8_t> corpus_input(const std::string& target, const std::string& file) {
  std::ifstream in(fs::path(SCALELAB_SOURCE_DIR) / "tests/fuzz/corpus" / target / file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Runs the target on the committed input; returns the rejection message ("" when accepted).
std::string rejection(const std::string& target_name, const std::string& file) {
  const auto bytes = corpus_input(target_name, file);
  EXPECT_FALSE(bytes.empty()) << file;
  const Outcome o = target(target_name).run(bytes.data(), bytes.size());
  return o == Outcome::kRejected ? last_rejection() : std::string();
}

TEST(FuzzFindings, ConfigNumberBeyondDoubleIsInvalidJson) {
  // nlohmann throws out_of_range (not parse_error) for 1e308-like overflows; it escaped as a crash.
  EXPECT_THAT(rejection("config", "crash-number-overflow-1e308"), HasSubstr("is not valid JSON"));
}

TEST(FuzzFindings, ConfigFloatWhereAnIntegerBelongs) {
  // "num_key_value_heads": 1e300 was cast to int64 (undefined behaviour).
  EXPECT_THAT(rejection("config", "found-float-for-integer-1e300"),
              HasSubstr("\"num_key_value_heads\" must be an integer, got 1e+300"));
}

TEST(FuzzFindings, ConfigSizesThatOverflowAreRefused) {
  // hidden_size 2^62 overflowed the parameter count (signed overflow in the tensor's numel).
  EXPECT_THAT(rejection("config", "found-size-overflow-2e62"), HasSubstr("hidden_size 4611686018427387904 is above"));
  // 10^11 layers: the parameter layout tried to allocate gigabytes.
  EXPECT_THAT(rejection("config", "found-layers-1e11-oom"), HasSubstr("num_hidden_layers 100000000000 is above"));
}

TEST(FuzzFindings, SweepWithTooManyCombinationsIsRefused) {
  // Eight lists of ten values: 10^8 combinations expanded in memory.
  EXPECT_THAT(rejection("sweep_spec", "found-combinations-1e8-oom"), HasSubstr("more than 100000 combinations"));
}

TEST(FuzzFindings, RegexWithAHugeBackReferenceIsRefused) {
  // A metric pattern with "\\2222...": libstdc++'s regex compiler overflowed a signed integer (UBSan).
  EXPECT_THAT(rejection("sweep_spec", "crash-regex-repeat-count-overflow"), HasSubstr("at most 5 digits"));
}

TEST(FuzzFindings, ProfileCsvWithNamesThatAreNotUtf8IsSummarized) {
  // A kernel name with the byte 0xFE: --format json (and a run record's profile.summary) threw
  // nlohmann's type_error 316. Now such bytes read as U+FFFD.
  const auto bytes = corpus_input("profile_summary", "crash-csv-name-not-utf8");
  EXPECT_EQ(target("profile_summary").run(bytes.data(), bytes.size()), Outcome::kAccepted) << last_rejection();
}

TEST(FuzzFindings, ProfileFiguresThatAreNotFiniteAreRefused) {
  // "inf" in an nsys CSV, and durations whose sums overflow a double, became JSON null, which
  // reading the summary back (a run record) refused with a type_error.
  EXPECT_THAT(rejection("profile_summary", "crash-csv-inf-figure"), HasSubstr("not a finite figure of at most 1e18"));
  EXPECT_THAT(rejection("profile_summary", "found-trace-dur-1e308"), HasSubstr("has dur = 1e+308"));
  EXPECT_THAT(rejection("profile_summary", "found-trace-dur-string-inf"), HasSubstr("has dur = inf"));
  // An instance count of 1e30 was cast to int64 (undefined behaviour).
  EXPECT_THAT(rejection("profile_summary", "found-csv-count-1e30"), HasSubstr("line 2: '1e30'"));
}

TEST(FuzzFindings, ProfileWithOnlyZeroDurationActivityOnADevice) {
  // A memcpy without a duration on a device with no other activity: the device's busy intervals
  // merged to none, and the idle-fraction figure read back() of the empty list (UBSan).
  const auto bytes = corpus_input("profile_summary", "crash-zero-duration-activity-only");
  EXPECT_EQ(target("profile_summary").run(bytes.data(), bytes.size()), Outcome::kAccepted) << last_rejection();
}

TEST(FuzzFindings, ProfileTraceFieldsOfAnotherTypeAreReadAsAbsent) {
  // "tid": "main", "rank": "0", "generator": 1, ...: json::value<int> / <string> threw type_error
  // (exit 1), and "world_size": 1e300 was cast to int (undefined behaviour). Fields of another
  // type than scalelab writes now read as absent.
  for (const char* file : {"found-trace-tid-string", "found-generator-number"}) {
    const auto bytes = corpus_input("profile_summary", file);
    EXPECT_EQ(target("profile_summary").run(bytes.data(), bytes.size()), Outcome::kAccepted) << file << ": " << last_rejection();
  }
  // libFuzzer reached the same through trace-merge: an op event with "tid": "cuda_runtime".
  const auto merged = corpus_input("trace_merge", "crash-field-of-another-type");
  EXPECT_EQ(target("trace_merge").run(merged.data(), merged.size()), Outcome::kAccepted) << last_rejection();
}

TEST(FuzzFindings, TraceMergeChecksWhatItReadsOfEachFile) {
  // Origins of -2^63 and 2^63-1 µs: their difference overflowed (UBSan). A rank or a ts that is a
  // string: nlohmann's type_error escaped (exit 1, a library message, no file named).
  EXPECT_THAT(rejection("trace_merge", "found-origin-overflow"), HasSubstr("rank0.json: otherData.origin_unix_us is"));
  EXPECT_THAT(rejection("trace_merge", "found-rank-string"), HasSubstr("rank0.json: otherData.rank is \"0\""));
  EXPECT_THAT(rejection("trace_merge", "found-ts-string"), HasSubstr("rank0.json: an event is not an object with a numeric ts"));
}

// Through the binary: exit 2, the file named on stderr.
struct Cli {
  int code;
  std::string err;
};
Cli scalelab(const std::string& args, const std::string& dir) {
  const std::string err = dir + "/err.txt";
  const std::string cmd = std::string(SCALELAB_EXE) + " " + args + " >/dev/null 2>" + err + " </dev/null";
  const int status = std::system(cmd.c_str());
  std::ifstream in(err);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1,
          std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>())};
}

TEST(FuzzFindings, TheCommandsExitTwoNamingTheFile) {
  const fs::path dir = fs::temp_directory_path() / ("scalelab-fuzz-cli-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  for (const char* file : {"crash-number-overflow-1e308", "found-float-for-integer-1e300", "found-size-overflow-2e62",
                           "found-layers-1e11-oom"}) {
    SCOPED_TRACE(file);
    const auto bytes = corpus_input("config", file);
    std::ofstream(dir / "config.json", std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                                              static_cast<std::streamsize>(bytes.size()));
    const Cli r = scalelab("plan --model " + dir.string(), dir.string());
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_THAT(r.err, HasSubstr((dir / "config.json").string()));
  }
  const auto spec = corpus_input("sweep_spec", "found-combinations-1e8-oom");
  std::ofstream(dir / "big.toml", std::ios::binary).write(reinterpret_cast<const char*>(spec.data()),
                                                         static_cast<std::streamsize>(spec.size()));
  const Cli r = scalelab("sweep " + (dir / "big.toml").string() + " --dry-run --db " + (dir / "r.db").string(),
                         dir.string());
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr((dir / "big.toml").string()));
  // profile-summary: figures that are not finite; a CSV without a table (named by its path, not
  // only its file name, since the harness's first input).
  for (const char* file : {"crash-csv-inf-figure", "found-trace-dur-1e308", "found-csv-count-1e30"}) {
    SCOPED_TRACE(file);
    const auto bytes = corpus_input("profile_summary", file);
    std::ofstream(dir / "trace.csv", std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                                            static_cast<std::streamsize>(bytes.size()));
    const Cli p = scalelab("profile-summary " + (dir / "trace.csv").string() + " --format json", dir.string());
    EXPECT_EQ(p.code, 2) << p.err;
    EXPECT_THAT(p.err, HasSubstr((dir / "trace.csv").string()));
  }
  std::ofstream(dir / "empty.csv").close();
  const Cli e = scalelab("profile-summary " + (dir / "empty.csv").string(), dir.string());
  EXPECT_EQ(e.code, 2) << e.err;
  EXPECT_THAT(e.err, HasSubstr((dir / "empty.csv").string()));
  // trace-merge: each input checked, named.
  const auto ts = corpus_input("trace_merge", "found-ts-string");
  std::ofstream(dir / "rank0.json", std::ios::binary).write(reinterpret_cast<const char*>(ts.data()),
                                                           static_cast<std::streamsize>(ts.size()));
  const Cli m = scalelab("trace-merge " + (dir / "rank0.json").string() + " -o " + (dir / "merged.json").string(), dir.string());
  EXPECT_EQ(m.code, 2) << m.err;
  EXPECT_THAT(m.err, HasSubstr((dir / "rank0.json").string()));
  EXPECT_FALSE(fs::exists(dir / "merged.json"));
  // Names that are not UTF-8 print as JSON (U+FFFD).
  const auto latin = corpus_input("profile_summary", "crash-csv-name-not-utf8");
  std::ofstream(dir / "latin.csv", std::ios::binary).write(reinterpret_cast<const char*>(latin.data()),
                                                          static_cast<std::streamsize>(latin.size()));
  const Cli l = scalelab("profile-summary " + (dir / "latin.csv").string() + " --format json", dir.string());
  EXPECT_EQ(l.code, 0) << l.err;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace scalelab::fuzz
