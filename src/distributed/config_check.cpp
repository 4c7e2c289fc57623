#include "distributed/config_check.h"

#include <algorithm>
#include <map>

#include "core/error.h"

namespace scalelab {
namespace {

void flatten(const nlohmann::json& j, const std::string& prefix, std::map<std::string, std::string>& out) {
  if (j.is_object() && !j.empty()) {
    for (auto it = j.begin(); it != j.end(); ++it)
      flatten(it.value(), prefix.empty() ? it.key() : prefix + "/" + it.key(), out);
    return;
  }
  out[prefix] = j.dump();
}

nlohmann::json without(const nlohmann::json& config, const std::vector<std::string>& ignore) {
  nlohmann::json c = config;
  if (c.is_object())
    for (const std::string& k : ignore) c.erase(k);
  return c;
}

}  // namespace

std::uint64_t config_hash(const nlohmann::json& config) {
  // FNV-1a: a few lines, stable across processes and machines (std::hash is not promised to be),
  // and collisions only matter for configs that differ, which the key-by-key diff then names.
  const std::string s = config.dump();
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::vector<ConfigDiff> diff_configs(const nlohmann::json& reference, const nlohmann::json& other) {
  std::map<std::string, std::string> a, b;
  flatten(reference, "", a);
  flatten(other, "", b);
  std::vector<ConfigDiff> out;
  for (const auto& [k, v] : a) {
    auto it = b.find(k);
    if (it == b.end()) out.push_back({k, v, "(absent)"});
    else if (it->second != v) out.push_back({k, v, it->second});
  }
  for (const auto& [k, v] : b)
    if (!a.count(k)) out.push_back({k, "(absent)", v});
  std::sort(out.begin(), out.end(), [](const ConfigDiff& x, const ConfigDiff& y) { return x.key < y.key; });
  return out;
}

void check_same_config(Communicator& comm, const nlohmann::json& config, const std::vector<std::string>& ignore) {
  const nlohmann::json mine = without(config, ignore);
  const std::vector<std::uint64_t> hashes = comm.all_gather_value<std::uint64_t>(config_hash(mine));
  if (std::all_of(hashes.begin(), hashes.end(), [&](std::uint64_t h) { return h == hashes[0]; })) return;

  // Some rank differs: each rank diffs itself against rank 0's config, and the diffs are shared
  // so that every rank throws the same, complete message.
  const nlohmann::json reference = nlohmann::json::parse(comm.broadcast_string(mine.dump(), 0));
  std::string my_report;
  if (hashes[static_cast<std::size_t>(comm.rank())] != hashes[0]) {
    const std::vector<ConfigDiff> diffs = diff_configs(reference, mine);
    const std::string r = std::to_string(comm.rank());
    my_report = "rank " + r + " differs from rank 0 in ";
    const std::size_t shown = std::min<std::size_t>(diffs.size(), 4);
    for (std::size_t i = 0; i < shown; ++i) {
      if (i) my_report += ", ";
      const std::string key = diffs[i].key.empty() ? "(the whole config)" : diffs[i].key;
      my_report += key + " (rank " + r + ": " + diffs[i].other + ", rank 0: " + diffs[i].reference + ")";
    }
    if (diffs.size() > shown) my_report += " and " + std::to_string(diffs.size() - shown) + " more keys";
    if (diffs.empty()) my_report += "the hash only (no key differs: a hash collision or a bug)";
  }
  const std::vector<std::string> reports = comm.all_gather_strings(my_report);
  std::string msg = "[dist] ranks run different configurations: ";
  int listed = 0, differing = 0;
  for (const std::string& rep : reports) {
    if (rep.empty()) continue;
    ++differing;
    if (listed < 8) {
      msg += (listed ? "; " : "") + rep;
      ++listed;
    }
  }
  if (differing > listed) msg += "; and " + std::to_string(differing - listed) + " more ranks";
  msg += " — launch every rank with the same flags and files";
  throw InvalidInput(msg);
}

}  // namespace scalelab
