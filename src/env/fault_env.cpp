#include "env/fault_env.h"

#include <cerrno>
#include <algorithm>
#include <iterator>
#include <vector>

namespace mz {
namespace {

class FaultFile final : public File {
 public:
  FaultFile(FaultEnv* env, std::unique_ptr<File> f) : env_(env), f_(std::move(f)) {}
  Status Read(void* buf, size_t n, uint64_t off, size_t* got) override {
    env_->n_reads++;
    if (FaultEnv::Fire(env_->fail_reads_after)) {
      *got = 0;
      return Status::FromErrno(EIO, "read " + f_->path() + " (injected)");
    }
    if (FaultEnv::Fire(env_->short_reads_after)) n /= 2;
    Status st = f_->Read(buf, n, off, got);
    if (st.ok() && *got > 0 && FaultEnv::Fire(env_->flip_bit_read_after))
      static_cast<uint8_t*>(buf)[*got / 2] ^= 0x10;
    env_->bytes_read += int64_t(*got);
    return st;
  }
  // One read of the whole range, as a preadv is one request: fail_reads_after fails all of it,
  // short_reads_after reads its first half, flip_bit_read_after flips a bit of the first byte of
  // the segment holding the middle of what was read (a segment's first byte is always data, never
  // padding past a payload).
  Status ReadV(const Segment* segs, int n, uint64_t off, size_t* got) override {
    env_->n_reads++;
    if (FaultEnv::Fire(env_->fail_reads_after)) {
      *got = 0;
      return Status::FromErrno(EIO, "read " + f_->path() + " (injected)");
    }
    std::vector<Segment> v(segs, segs + n);
    if (FaultEnv::Fire(env_->short_reads_after)) {
      size_t total = 0;
      for (const Segment& s : v) total += s.len;
      size_t keep = size_t(AlignDown(total / 2, kDirectIoAlign));  // O_DIRECT lengths stay aligned
      for (Segment& s : v) {
        s.len = std::min(s.len, keep);
        keep -= s.len;
      }
    }
    Status st = f_->ReadV(v.data(), int(v.size()), off, got);
    if (st.ok() && *got > 0 && FaultEnv::Fire(env_->flip_bit_read_after)) {
      size_t at = *got / 2;
      for (const Segment& s : v) {
        if (at < s.len) {
          static_cast<uint8_t*>(s.buf)[0] ^= 0x10;
          break;
        }
        at -= s.len;
      }
    }
    env_->bytes_read += int64_t(*got);
    return st;
  }
  Status Write(const void* buf, size_t n, uint64_t off) override {
    env_->n_writes++;
    if (FaultEnv::Fire(env_->fail_writes_after)) return Status::FromErrno(EIO, "write " + f_->path() + " (injected)");
    int64_t budget = env_->write_budget.load();
    if (budget >= 0) {
      if (int64_t(n) > budget) return Status::FromErrno(ENOSPC, "write " + f_->path() + " (injected)");
      env_->write_budget -= int64_t(n);
    }
    env_->bytes_written += int64_t(n);
    return f_->Write(buf, n, off);
  }
  Status Sync() override { return f_->Sync(); }
  Status Truncate(uint64_t size) override { return f_->Truncate(size); }
  Status Stat(FileInfo* info) override { return f_->Stat(info); }
  bool direct() const override { return f_->direct(); }
  const std::string& path() const override { return f_->path(); }
  int native_handle() const override { return f_->native_handle(); }

 private:
  FaultEnv* env_;
  std::unique_ptr<File> f_;
};

}  // namespace

bool FaultEnv::Fire(std::atomic<int64_t>& c) {
  int64_t v = c.load();
  while (v >= 0) {
    if (c.compare_exchange_weak(v, v - 1)) return v == 0;
  }
  return false;
}

Status FaultEnv::Open(const std::string& path, OpenMode mode, bool direct, std::unique_ptr<File>* out) {
  std::unique_ptr<File> f;
  MZ_RETURN_IF_ERROR(target()->Open(path, mode, direct, &f));
  if (!path_filter.empty() && path.find(path_filter) == std::string::npos) {
    *out = std::move(f);
    return Status::Ok();
  }
  out->reset(new FaultFile(this, std::move(f)));
  return Status::Ok();
}

void* FaultEnv::MapAnon(size_t bytes) {
  if (Fire(fail_maps_after)) return nullptr;
  return target()->MapAnon(bytes);
}

Status FaultEnv::MapFileAt(File* f, uint64_t off, size_t len, void* at, bool writable) {
  Status st = target()->MapFileAt(f, off, len, at, writable);
  if (st.ok() && writable) {
    std::lock_guard<std::mutex> lk(mu_);
    writable_[reinterpret_cast<uintptr_t>(at)] = len;
  }
  return st;
}

void FaultEnv::Unmap(void* p, size_t bytes) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    writable_.erase(writable_.lower_bound(a), writable_.lower_bound(a + bytes));
  }
  target()->Unmap(p, bytes);
}

Status FaultEnv::PopulateMapped(File* f, void* p, size_t bytes, uint64_t file_off) {
  const std::string& path = f->path();
  bool flip = false;
  if (path_filter.empty() || path.find(path_filter) != std::string::npos) {
    n_reads++;
    if (Fire(fail_reads_after)) return Status::FromErrno(EIO, "reading mapped " + path + " (injected)");
    // A mapping past the end of a file cut short fails to populate (EFAULT, reported as EIO).
    if (Fire(short_reads_after)) return Status::FromErrno(EIO, "reading mapped " + path + " (injected: file cut short)");
    bytes_read += int64_t(bytes);
    if (bytes > 0) {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = writable_.upper_bound(reinterpret_cast<uintptr_t>(p));
      flip = it != writable_.begin() && std::prev(it)->first + std::prev(it)->second > reinterpret_cast<uintptr_t>(p) &&
             Fire(flip_bit_read_after);
    }
  }
  Status st = target()->PopulateMapped(f, p, bytes, file_off);
  if (st.ok() && flip) static_cast<unsigned char*>(p)[0] ^= 0x10;
  return st;
}

// ---- Fakes and faults of the small-file, environment and wake-up calls ----

void FaultEnv::SetFakeFile(const std::string& path, std::string content) {
  std::lock_guard<std::mutex> lk(fake_mu_);
  fake_files_[path] = std::move(content);
}

void FaultEnv::RemoveFakeFile(const std::string& path) {
  std::lock_guard<std::mutex> lk(fake_mu_);
  fake_files_.erase(path);
}

bool FaultEnv::Fires(std::atomic<int64_t>& countdown, const std::string& path) const {
  if (!path_filter.empty() && path.find(path_filter) == std::string::npos) return false;
  int64_t v = countdown.load();
  while (v > 0 && !countdown.compare_exchange_weak(v, v - 1)) {
  }
  return v == 0;  // stays at 0: fires from now on
}

Status FaultEnv::Rename(const std::string& from, const std::string& to) {
  std::string c;
  const int f = Fake(from, &c);
  if (f < 0) return Status::FromErrno(ENOENT, "rename " + from + " (hidden by a fake tree)");
  if (f == 0) return target()->Rename(from, to);
  RemoveFakeFile(from);
  SetFakeFile(to, std::move(c));
  return Status::Ok();
}

Status FaultEnv::Remove(const std::string& path) {
  const int f = Fake(path, nullptr);
  if (f < 0) return Status::FromErrno(ENOENT, "remove " + path + " (hidden by a fake tree)");
  if (f > 0) {
    RemoveFakeFile(path);
    return Status::Ok();
  }
  if (Fires(fail_removes_after, path)) return Status::FromErrno(EIO, "remove " + path + " (injected)");
  return target()->Remove(path);
}

Status FaultEnv::SyncDir(const std::string& path) {
  if (Fake(path, nullptr) != 0) return Status::Ok();
  if (on_sync_dir) on_sync_dir(path);
  if (Fires(fail_sync_dirs_after, path)) return Status::FromErrno(EIO, "fsync of the folder of " + path + " (injected)");
  return target()->SyncDir(path);
}

bool FaultEnv::FakeFile(const std::string& path, std::string* content) const {
  std::lock_guard<std::mutex> lk(fake_mu_);
  auto it = fake_files_.find(path);
  if (it == fake_files_.end()) return false;
  *content = it->second;
  return true;
}

void FaultEnv::HideRealFilesUnder(const std::string& prefix) {
  std::lock_guard<std::mutex> lk(fake_mu_);
  hidden_prefixes_.push_back(prefix);
}

void FaultEnv::SetEnvVar(const std::string& name, std::string value) {
  std::lock_guard<std::mutex> lk(fake_mu_);
  fake_env_[name] = std::move(value);
}

int FaultEnv::Fake(const std::string& path, std::string* content) const {
  std::lock_guard<std::mutex> lk(fake_mu_);
  auto it = fake_files_.find(path);
  if (it != fake_files_.end()) {
    if (content) *content = it->second;
    return 1;
  }
  for (const std::string& p : hidden_prefixes_)
    if (path.compare(0, p.size(), p) == 0) return -1;
  return 0;
}

Status FaultEnv::StatPath(const std::string& path, FileInfo* info) {
  std::string c;
  const int f = Fake(path, &c);
  if (f < 0) return Status::FromErrno(ENOENT, "stat " + path + " (hidden by a fake tree)");
  if (f > 0) {
    *info = FileInfo();
    info->size = c.size();
    return Status::Ok();
  }
  return target()->StatPath(path, info);
}

Status FaultEnv::ReadSmallFile(const std::string& path, std::string* out) {
  out->clear();
  ++n_small_reads;
  if (Filtered(path) && Fire(fail_small_reads_after)) return Status::FromErrno(EIO, "read " + path + " (injected)");
  const int f = Fake(path, out);
  if (f < 0) return Status::FromErrno(ENOENT, "open " + path + " (hidden by a fake tree)");
  if (f > 0) return Status::Ok();
  return target()->ReadSmallFile(path, out);
}

Status FaultEnv::ListDir(const std::string& path, std::vector<std::string>* out) {
  out->clear();
  ++n_small_reads;
  if (Filtered(path) && Fire(fail_small_reads_after)) return Status::FromErrno(EIO, "opendir " + path + " (injected)");
  std::string dir = path;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const std::string prefix = dir + "/";
  std::vector<std::string> names;
  bool hidden = false;
  {
    std::lock_guard<std::mutex> lk(fake_mu_);
    for (auto it = fake_files_.lower_bound(prefix); it != fake_files_.end(); ++it) {
      if (it->first.compare(0, prefix.size(), prefix) != 0) break;
      const std::string rest = it->first.substr(prefix.size());
      const std::string name = rest.substr(0, rest.find('/'));
      if (!name.empty() && (names.empty() || names.back() != name)) names.push_back(name);
    }
    for (const std::string& p : hidden_prefixes_)
      if (prefix.compare(0, p.size(), p) == 0 || dir == p) hidden = true;
  }
  if (!hidden) {
    std::vector<std::string> real;
    Status st = target()->ListDir(path, &real);
    if (!st.ok() && names.empty()) return st;
    names.insert(names.end(), real.begin(), real.end());
  } else if (names.empty()) {
    return Status::FromErrno(ENOENT, "opendir " + path + " (hidden by a fake tree)");
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  *out = std::move(names);
  return Status::Ok();
}

Status FaultEnv::SetThreadAffinity(const std::vector<int>& cpus) {
  {
    std::lock_guard<std::mutex> lk(affinity_mu_);
    affinity_log_.push_back(cpus);
  }
  if (refuse_affinity.load()) return Status::FromErrno(EINVAL, "sched_setaffinity (injected)");
  return EnvWrapper::SetThreadAffinity(cpus);
}

std::vector<std::vector<int>> FaultEnv::affinity_log() const {
  std::lock_guard<std::mutex> lk(affinity_mu_);
  return affinity_log_;
}

void FaultEnv::clear_affinity_log() {
  std::lock_guard<std::mutex> lk(affinity_mu_);
  affinity_log_.clear();
}

Status FaultEnv::WriteSmallFile(const std::string& path, const std::string& data, bool create) {
  ++n_small_writes;
  if (Filtered(path) && Fire(fail_small_writes_after))
    return Status::FromErrno(EIO, "write '" + data + "' to " + path + " (injected)");
  const int f = Fake(path, nullptr);
  if (f < 0 && !create) return Status::FromErrno(ENOENT, "open " + path + " (hidden by a fake tree)");
  if (f != 0) {
    SetFakeFile(path, data);
    return Status::Ok();
  }
  return target()->WriteSmallFile(path, data, create);
}

Status FaultEnv::CheckAccess(const std::string& path, bool write) {
  const int f = Fake(path, nullptr);
  if (f < 0) return Status::FromErrno(ENOENT, "access " + path + " (hidden by a fake tree)");
  if (f > 0) return Status::Ok();
  return target()->CheckAccess(path, write);
}

Status FaultEnv::GetEnvVar(const std::string& name, std::string* value) {
  value->clear();
  if (Fire(fail_env_vars_after)) return Status::IOError("getenv " + name + " (injected)");
  {
    std::lock_guard<std::mutex> lk(fake_mu_);
    auto it = fake_env_.find(name);
    if (it != fake_env_.end()) {
      *value = it->second;
      return Status::Ok();
    }
  }
  return target()->GetEnvVar(name, value);
}

Status FaultEnv::NewEventCounter(std::unique_ptr<WaitHandle>* out) {
  out->reset();
  if (Fire(fail_events_after)) return Status::FromErrno(EMFILE, "eventfd (injected)");
  return target()->NewEventCounter(out);
}

Status FaultEnv::OpenNotifyFile(const std::string& path, bool write, std::unique_ptr<WaitHandle>* out) {
  out->reset();
  if (Fire(fail_events_after)) return Status::FromErrno(EMFILE, "open " + path + " (injected)");
  if (Fake(path, nullptr) < 0) return Status::FromErrno(ENOENT, "open " + path + " (hidden by a fake tree)");
  return target()->OpenNotifyFile(path, write, out);
}

Status FaultEnv::Poll(PollEntry* entries, int n, int timeout_ms, int* n_ready) {
  if (Fire(fail_polls_after)) {
    *n_ready = 0;
    for (int i = 0; i < n; ++i) entries[i].ready = entries[i].error = false;
    return Status::FromErrno(EIO, "poll (injected)");
  }
  return target()->Poll(entries, n, timeout_ms, n_ready);
}

namespace fault_env {
// A socket whose reads count against the FaultEnv that made it (which outlives its sockets).
class FaultSocket final : public Socket {
 public:
  FaultSocket(FaultEnv* env, std::unique_ptr<Socket> s) : env_(env), s_(std::move(s)) {}
  Status WriteAll(const void* buf, size_t n) override { return s_->WriteAll(buf, n); }
  Status ReadSome(void* buf, size_t cap, size_t* got) override {
    *got = 0;
    ++env_->n_socket_reads;
    if (FaultEnv::Fire(env_->fail_socket_reads_after))
      return Status::IOError("reading a reply: Connection reset by peer (injected)");
    return s_->ReadSome(buf, cap, got);
  }
  const std::string& peer() const override { return s_->peer(); }

 private:
  FaultEnv* env_;
  std::unique_ptr<Socket> s_;
};
}  // namespace fault_env

Status FaultEnv::ConnectTcp(const std::string& host, int port, uint32_t timeout_ms, std::unique_ptr<Socket>* out) {
  out->reset();
  ++n_connects;
  if (Fire(fail_connects_after))
    return Status::IOError("connecting to " + host + ":" + std::to_string(port) + ": Connection refused (injected)");
  std::unique_ptr<Socket> s;
  MZ_RETURN_IF_ERROR(target()->ConnectTcp(host, port, timeout_ms, &s));
  out->reset(new fault_env::FaultSocket(this, std::move(s)));
  return Status::Ok();
}

}  // namespace mz
