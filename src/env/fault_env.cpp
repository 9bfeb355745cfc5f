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

Status FaultEnv::PopulateMapped(File* f, void* p, size_t bytes) {
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
  Status st = target()->PopulateMapped(f, p, bytes);
  if (st.ok() && flip) static_cast<unsigned char*>(p)[0] ^= 0x10;
  return st;
}

}  // namespace mz
