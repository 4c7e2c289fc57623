#include "train/data.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include "core/error.h"

namespace scalelab {
namespace {

struct TmpFile {
  std::string path;
  explicit TmpFile(const std::vector<std::uint32_t>& ids, std::size_t extra_bytes = 0) {
    path = (std::filesystem::temp_directory_path() / ("scalelab_tokens_" + std::to_string(::getpid()) + "_" +
                                                      std::to_string(counter()++) + ".bin")).string();
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(ids.data()), static_cast<std::streamsize>(ids.size() * 4));
    for (std::size_t i = 0; i < extra_bytes; ++i) out.put('x');
  }
  ~TmpFile() { std::remove(path.c_str()); }
  static int& counter() {
    static int c = 0;
    return c;
  }
};

DeviceAllocator& alloc() {
  static DeviceAllocator a(make_host_backend(), std::size_t{1} << 30);
  return a;
}

TEST(Data, TokenFileIsReadInOrderAndWraps) {
  std::vector<std::uint32_t> ids;
  for (std::uint32_t i = 0; i < 10; ++i) ids.push_back(i);  // 3 samples of 3 tokens (seq 2) + 1 spare
  TmpFile f(ids);
  auto src = make_data_source({f.path, 2, 2, 100, 0, 0, 1});
  Batch b = make_batch(2, 2, alloc());
  src->next(b);
  const auto* in = b.inputs.data<std::int32_t>();
  const auto* tg = b.targets.data<std::int32_t>();
  EXPECT_EQ(std::vector<int>(in, in + 4), (std::vector<int>{0, 1, 3, 4}));
  EXPECT_EQ(std::vector<int>(tg, tg + 4), (std::vector<int>{1, 2, 4, 5}));
  src->next(b);  // sample 2, then wrap to sample 0
  EXPECT_EQ(std::vector<int>(in, in + 4), (std::vector<int>{6, 7, 0, 1}));
}

TEST(Data, RanksReadDisjointSamplesOfTheGlobalBatch) {
  std::vector<std::uint32_t> ids;
  for (std::uint32_t i = 0; i < 40; ++i) ids.push_back(i);
  TmpFile f(ids);
  auto r0 = make_data_source({f.path, 3, 1, 100, 0, 0, 2});
  auto r1 = make_data_source({f.path, 3, 1, 100, 0, 1, 2});
  Batch b0 = make_batch(1, 3, alloc()), b1 = make_batch(1, 3, alloc());
  r0->next(b0);
  r1->next(b1);
  EXPECT_EQ(b0.inputs.data<std::int32_t>()[0], 0);
  EXPECT_EQ(b1.inputs.data<std::int32_t>()[0], 4);
  r0->next(b0);
  EXPECT_EQ(b0.inputs.data<std::int32_t>()[0], 8);
}

// --resume seeks: skip(k) then next() reads what k + 1 next() calls would (token file: wrapping
// included; synthetic), on each rank.
TEST(Data, SkipEqualsReadingAndDropping) {
  std::vector<std::uint32_t> ids;
  for (std::uint32_t i = 0; i < 40; ++i) ids.push_back(i);
  TmpFile f(ids);
  for (const std::string& spec : {f.path, std::string("synthetic")}) {
    for (int rank = 0; rank < 2; ++rank) {
      DataOptions d{spec, 3, 2, 100, 7, rank, 2};
      auto read = make_data_source(d), seek = make_data_source(d);
      Batch a = make_batch(2, 3, alloc()), b = make_batch(2, 3, alloc());
      for (int i = 0; i < 9; ++i) read->next(a);  // wraps the 10-sample file
      seek->skip(9, b);
      read->next(a);
      seek->next(b);
      const auto* ia = a.inputs.data<std::int32_t>();
      const auto* ib = b.inputs.data<std::int32_t>();
      EXPECT_EQ(std::vector<std::int32_t>(ia, ia + 6), std::vector<std::int32_t>(ib, ib + 6)) << spec << " rank " << rank;
      const auto* ta = a.targets.data<std::int32_t>();
      const auto* tb = b.targets.data<std::int32_t>();
      EXPECT_EQ(std::vector<std::int32_t>(ta, ta + 6), std::vector<std::int32_t>(tb, tb + 6)) << spec << " rank " << rank;
    }
  }
}

TEST(Data, SyntheticIsDeterministicSharedAcrossRanksAndInRange) {
  auto one = make_data_source({"synthetic", 8, 2, 32768, 7, 0, 1});
  auto r1 = make_data_source({"synthetic", 8, 1, 32768, 7, 1, 2});
  Batch b = make_batch(2, 8, alloc()), c = make_batch(1, 8, alloc());
  one->next(b);
  r1->next(c);
  // Rank 1 of 2 with micro-batch 1 reads the second sample of the single-rank micro-batch of 2.
  for (int i = 0; i < 8; ++i) EXPECT_EQ(c.inputs.data<std::int32_t>()[i], b.inputs.data<std::int32_t>()[8 + i]);
  for (int i = 0; i < 16; ++i) {
    EXPECT_GE(b.inputs.data<std::int32_t>()[i], 0);
    EXPECT_LT(b.inputs.data<std::int32_t>()[i], 1000);
  }
  // Targets are inputs shifted by one.
  for (int i = 0; i < 7; ++i) EXPECT_EQ(b.targets.data<std::int32_t>()[i], b.inputs.data<std::int32_t>()[i + 1]);
  auto small = make_data_source({"synthetic", 8, 2, 50, 7, 0, 1});
  small->next(b);
  for (int i = 0; i < 16; ++i) EXPECT_LT(b.inputs.data<std::int32_t>()[i], 50);
}

TEST(Data, BadFilesAreInvalidInputNamingTheFile) {
  auto expect_msg = [](const DataOptions& o, const char* needle) {
    try {
      make_data_source(o);
      FAIL() << "expected InvalidInput";
    } catch (const InvalidInput& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_msg({"/nonexistent/tokens.bin", 4, 1, 100, 0, 0, 1}, "cannot open");
  TmpFile empty(std::vector<std::uint32_t>{});
  expect_msg({empty.path, 4, 1, 100, 0, 0, 1}, "is empty");
  TmpFile odd(std::vector<std::uint32_t>{1, 2, 3, 4, 5, 6}, 2);
  expect_msg({odd.path, 4, 1, 100, 0, 0, 1}, "multiple of 4");
  TmpFile short_file(std::vector<std::uint32_t>{1, 2, 3});
  expect_msg({short_file.path, 4, 1, 100, 0, 0, 1}, "fewer than one sample");
  TmpFile big_id(std::vector<std::uint32_t>{1, 2, 300, 4, 5, 6});
  expect_msg({big_id.path, 4, 1, 100, 0, 0, 1}, "token 300 at index 2");
}

}  // namespace
}  // namespace scalelab
