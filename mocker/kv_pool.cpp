#include "mocker/kv_pool.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>
#include <unordered_set>

namespace kvroute::mocker {

namespace fs = std::filesystem;

namespace {

constexpr size_t kFileBytes = 17;  // u64 local hash, u8 has_parent, u64 parent (little-endian)

void put_le(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
uint64_t get_le(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

// The block id of a pool file name, or nullopt for another file.
std::optional<uint64_t> id_of(const std::string& name) {
  if (name.size() != 16) return std::nullopt;
  uint64_t v = 0;
  for (char c : name) {
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return std::nullopt;
    v = v << 4 | static_cast<uint64_t>(d);
  }
  return v;
}

}  // namespace

bool KvPoolDir::open(std::string* err) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec || !fs::is_directory(dir_, ec)) {
    if (err) *err = fmt::format("--kv-pool-dir {}: {}", dir_, ec ? ec.message() : "not a directory");
    return false;
  }
  return true;
}

std::string KvPoolDir::path(SequenceHash id) const { return fmt::format("{}/{:016x}", dir_, id.value); }

bool KvPoolDir::contains(SequenceHash id) const {
  struct stat st;
  return ::stat(path(id).c_str(), &st) == 0;
}

bool KvPoolDir::put(SequenceHash id, const BlockMeta& meta) {
  // Written to a private name, then linked to the block's name: link() fails
  // if another mocker stored the block first, and a reader never sees a
  // partly written file.
  const std::string final_path = path(id);
  const std::string tmp = fmt::format("{}.{}.tmp", final_path, ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return false;
  unsigned char buf[kFileBytes] = {};
  put_le(buf, meta.local.value);
  buf[8] = meta.parent ? 1 : 0;
  put_le(buf + 9, meta.parent ? meta.parent->value : 0);
  const bool written = ::write(fd, buf, sizeof buf) == static_cast<ssize_t>(sizeof buf);
  ::close(fd);
  const bool created = written && ::link(tmp.c_str(), final_path.c_str()) == 0;
  ::unlink(tmp.c_str());
  return created;
}

bool KvPoolDir::remove(SequenceHash id) { return ::unlink(path(id).c_str()) == 0; }

std::vector<SequenceHash> KvPoolDir::over_capacity(uint64_t capacity) const {
  std::vector<std::pair<fs::file_time_type, uint64_t>> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const auto id = id_of(e.path().filename().string());
    if (!id) continue;
    std::error_code tec;
    const auto t = e.last_write_time(tec);
    if (!tec) files.emplace_back(t, *id);
  }
  std::vector<SequenceHash> out;
  if (files.size() <= capacity) return out;
  std::sort(files.begin(), files.end());
  for (size_t i = 0; i < files.size() - capacity; ++i) out.push_back(SequenceHash{files[i].second});
  return out;
}

std::vector<std::pair<SequenceHash, BlockMeta>> KvPoolDir::list() const {
  std::vector<std::pair<SequenceHash, BlockMeta>> all;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const auto id = id_of(e.path().filename().string());
    if (!id) continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    unsigned char buf[kFileBytes];
    const bool ok = ::read(fd, buf, sizeof buf) == static_cast<ssize_t>(sizeof buf);
    ::close(fd);
    if (!ok) continue;
    BlockMeta m{LocalBlockHash{get_le(buf)}, std::nullopt};
    if (buf[8]) m.parent = SequenceHash{get_le(buf + 9)};
    all.emplace_back(SequenceHash{*id}, m);
  }
  // Parents first: repeatedly take the blocks whose parent is taken or absent.
  std::unordered_set<uint64_t> present, done;
  for (const auto& b : all) present.insert(b.first.value);
  std::vector<std::pair<SequenceHash, BlockMeta>> out;
  out.reserve(all.size());
  while (out.size() < all.size()) {
    const size_t before = out.size();
    for (const auto& b : all) {
      if (done.count(b.first.value)) continue;
      const auto& p = b.second.parent;
      if (p && present.count(p->value) && !done.count(p->value)) continue;
      done.insert(b.first.value);
      out.push_back(b);
    }
    if (out.size() == before) break;  // a cycle (a corrupt pool): the rest is left out
  }
  return out;
}

std::vector<SequenceHash> HostTier::put(SequenceHash id, const BlockMeta& meta) {
  std::vector<SequenceHash> out;
  if (capacity_ == 0) return out;
  if (auto it = at_.find(id.value); it != at_.end()) {
    order_.erase(it->second.pos);
    at_.erase(it);
  }
  while (at_.size() >= capacity_) {
    out.push_back(SequenceHash{order_.front()});
    at_.erase(order_.front());
    order_.pop_front();
  }
  order_.push_back(id.value);
  at_.emplace(id.value, Entry{meta, std::prev(order_.end())});
  return out;
}

bool HostTier::take(SequenceHash id) {
  auto it = at_.find(id.value);
  if (it == at_.end()) return false;
  order_.erase(it->second.pos);
  at_.erase(it);
  return true;
}

std::vector<std::pair<SequenceHash, BlockMeta>> HostTier::list() const {
  std::vector<std::pair<SequenceHash, BlockMeta>> out;
  for (uint64_t id : order_) out.emplace_back(SequenceHash{id}, at_.at(id).meta);
  return out;
}

double load_ms(uint64_t blocks, uint32_t block_size, double kv_bytes_per_token, double gbps) {
  if (gbps <= 0) return 0;
  return static_cast<double>(blocks) * block_size * kv_bytes_per_token * 8 / (gbps * 1e9) * 1000.0;
}

}  // namespace kvroute::mocker
