#pragma once
// The communicator of a one-process job: every collective is the identity (a sum, average,
// maximum or gather over one rank), completes at once and costs nothing.
#include "distributed/communicator.h"

namespace scalelab {

class SingleCommunicator final : public Communicator {
 public:
  explicit SingleCommunicator(CommOptions options = {}) : options_(options) {}

  const char* backend() const override { return "single"; }
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  int local_rank() const override { return 0; }
  const CommOptions& options() const override { return options_; }

  std::unique_ptr<CommWork> all_reduce_async(void* buf, std::int64_t count, CommDType dtype,
                                             ReduceOp op) override;
  std::unique_ptr<CommWork> broadcast_async(void* buf, std::int64_t count, CommDType dtype,
                                            int root) override;
  std::unique_ptr<CommWork> all_gather_async(void* buf, std::span<const std::int64_t> counts,
                                             CommDType dtype) override;
  std::unique_ptr<CommWork> reduce_scatter_async(const void* send, void* recv,
                                                 std::span<const std::int64_t> counts,
                                                 CommDType dtype, ReduceOp op) override;
  std::unique_ptr<CommWork> barrier_async() override;

  void notify_failure(const std::string&) override {}
  std::optional<std::string> peer_failure() const override { return std::nullopt; }

 private:
  CommOptions options_;
};

}  // namespace scalelab
