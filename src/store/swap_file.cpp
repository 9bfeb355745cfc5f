#include "store/swap_file.h"

#include <xxhash.h>

#include <cstdlib>
#include <cstring>
#include <vector>

namespace mz {
namespace {

struct AlignedBuf {
  explicit AlignedBuf(size_t n) : n(n), p(static_cast<uint8_t*>(std::aligned_alloc(kDirectIoAlign, AlignUp(n, kDirectIoAlign)))) {}
  ~AlignedBuf() { std::free(p); }
  size_t n;
  uint8_t* p;
};

bool Aligned(const void* p, size_t n) {
  return (reinterpret_cast<uintptr_t>(p) % kDirectIoAlign) == 0 && n % kDirectIoAlign == 0;
}

}  // namespace

Status SwapFile::Create(Env* env, const std::string& path, bool direct, std::unique_ptr<SwapFile>* out) {
  std::unique_ptr<File> f;
  MZ_RETURN_IF_ERROR(env->Open(path, OpenMode::kCreateTrunc, direct, &f));
  AlignedBuf hdr(kHeaderBytes);
  if (!hdr.p) return Status::NoMemory("swap header buffer");
  std::memset(hdr.p, 0, kHeaderBytes);
  std::memcpy(hdr.p, "MZSWAP01", 8);
  const uint32_t version = 1, align = uint32_t(kDirectIoAlign);
  std::memcpy(hdr.p + 8, &version, 4);
  std::memcpy(hdr.p + 12, &align, 4);
  Status st = f->Write(hdr.p, kHeaderBytes, 0);
  if (!st.ok()) {
    f.reset();
    env->Remove(path);
    return st.With("creating swap file " + path);
  }
  out->reset(new SwapFile(env, path, std::move(f)));
  return Status::Ok();
}

Status SwapFile::OpenReadOnly(Env* env, const std::string& path, bool direct, std::unique_ptr<SwapFile>* out) {
  std::unique_ptr<File> f;
  MZ_RETURN_IF_ERROR(env->Open(path, OpenMode::kRead, direct, &f).With("opening " + path + " as storage"));
  FileInfo fi;
  MZ_RETURN_IF_ERROR(f->Stat(&fi).With("opening " + path + " as storage"));
  out->reset(new SwapFile(env, path, std::move(f)));
  (*out)->read_only_ = true;
  (*out)->end_ = fi.size;
  return Status::Ok();
}

SwapFile::~SwapFile() {
  file_.reset();
  if (!read_only_) env_->Remove(path_);
}

uint64_t SwapFile::Allocate(uint64_t len) {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second >= len) {
      const uint64_t off = it->first, rest = it->second - len;
      free_.erase(it);
      if (rest) free_[off + len] = rest;
      used_ += len;
      return off;
    }
  }
  const uint64_t off = end_;
  end_ += len;
  used_ += len;
  return off;
}

void SwapFile::Release(uint64_t off, uint64_t len) {
  std::lock_guard<std::mutex> lk(mu_);
  used_ -= len;
  auto next = free_.lower_bound(off);
  if (next != free_.end() && off + len == next->first) {
    len += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      prev->second += len;
      off = prev->first;
      len = prev->second;
      free_.erase(prev);
    }
  }
  if (off + len == end_) {
    end_ = off;  // trailing free space: shrink the logical end (the file is truncated lazily)
  } else {
    free_[off] = len;
  }
}

Status SwapFile::Write(const void* data, size_t n, SwapExtent* out) {
  if (n == 0) return Status::InvalidArgument("empty swap write");
  if (read_only_) return Status::InvalidArgument("writing to " + path_ + ", opened read-only");
  const uint64_t len = AlignUp(n, kDirectIoAlign);
  const uint64_t off = Allocate(len);
  Status st;
  if (Aligned(data, n) || !file_->direct()) {
    st = file_->Write(data, n, off);
  } else {
    AlignedBuf b(n);
    if (!b.p) {
      Release(off, len);
      return Status::NoMemory("swap bounce buffer");
    }
    std::memcpy(b.p, data, n);
    std::memset(b.p + n, 0, len - n);
    st = file_->Write(b.p, len, off);
  }
  if (!st.ok()) {
    Release(off, len);
    return st.With("swap write of " + std::to_string(n) + " bytes at " + std::to_string(off));
  }
  out->off = off;
  out->len = len;
  out->size = n;
  out->hash = XXH64(data, n, 0);
  return Status::Ok();
}

Status SwapFile::Read(const SwapExtent& e, void* dst) const {
  if (!e.valid()) return Status::InvalidArgument("reading an empty swap extent");
  size_t got = 0;
  Status st;
  if (Aligned(dst, e.size) || !file_->direct()) {
    st = file_->Read(dst, e.size, e.off, &got);
    if (st.ok() && got != e.size) st = Status::IOError("short read");
  } else {
    AlignedBuf b(e.len);
    if (!b.p) return Status::NoMemory("swap bounce buffer");
    st = file_->Read(b.p, e.len, e.off, &got);
    if (st.ok() && got < e.size) st = Status::IOError("short read");
    if (st.ok()) std::memcpy(dst, b.p, e.size);
  }
  if (!st.ok()) return st.With("swap read of " + std::to_string(e.size) + " bytes at " + std::to_string(e.off));
  if (XXH64(dst, e.size, 0) != e.hash)
    return Status::Corruption("swap checksum mismatch for " + std::to_string(e.size) + " bytes at offset " +
                              std::to_string(e.off) + " of " + path_);
  return Status::Ok();
}

Status SwapFile::ReadPadded(const SwapExtent& e, void* dst) const {
  Status each;
  Status st = ReadPaddedRun(&e, &dst, 1, &each);  // a run of one: the same checks and read
  return st.ok() ? each : st;
}

Status SwapFile::ReadPaddedRun(const SwapExtent* e, void* const* dst, int n, Status* each) const {
  if (n <= 0) return Status::InvalidArgument("empty swap read run");
  std::vector<File::Segment> segs(static_cast<size_t>(n));
  uint64_t total = 0;
  for (int i = 0; i < n; ++i) {
    if (!e[i].valid()) return Status::InvalidArgument("reading an empty swap extent");
    if (!Aligned(dst[i], e[i].len)) return Status::InvalidArgument("ReadPaddedRun needs aligned buffers");
    if (i > 0 && e[i - 1].off + e[i - 1].len != e[i].off)
      return Status::InvalidArgument("ReadPaddedRun: extents are not back to back");
    segs[size_t(i)] = {dst[i], size_t(e[i].len)};
    total += e[i].len;
  }
  size_t got = 0;
  Status st = file_->ReadV(segs.data(), n, e[0].off, &got);
  const uint64_t need = total - e[n - 1].len + e[n - 1].size;  // the last extent's padding may be missing
  if (st.ok() && got < need) st = Status::IOError("short read");
  if (!st.ok())
    return st.With("swap read of " + std::to_string(n) + " extents (" + std::to_string(total) + " bytes) at " +
                   std::to_string(e[0].off));
  for (int i = 0; i < n; ++i) each[i] = Verify(e[i], dst[i]);
  return Status::Ok();
}

Status SwapFile::Verify(const SwapExtent& e, const void* data) const {
  if (XXH64(data, e.size, 0) != e.hash)
    return Status::Corruption("swap checksum mismatch for " + std::to_string(e.size) + " bytes at offset " +
                              std::to_string(e.off) + " of " + path_);
  return Status::Ok();
}

void SwapFile::Free(const SwapExtent& e) {
  if (e.valid() && !read_only_) Release(e.off, e.len);
}

uint64_t SwapFile::used_bytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  return used_;
}
uint64_t SwapFile::file_bytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  return end_;
}

}  // namespace mz
