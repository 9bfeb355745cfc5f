// SwapFile: the storage swap for evicted KV chunks (raw or compressed), one file per context.
//
// Format: a 4096-byte header (magic "MZSWAP01", version, alignment) followed by extents, each
// 4096-aligned, holding one chunk's bytes. The file is process-private scratch: the index of what
// lives where (SwapExtent, with an xxh64 of the payload) is kept in memory by the owner; a killed
// process's context is recovered from a session file, not from this file.
//
// I/O is direct (O_DIRECT) with aligned buffers: data already page-aligned with an aligned length is
// written/read in place (zero-copy); otherwise through an aligned bounce buffer. Space is reused:
// freed extents go to a coalescing free list and are handed out first-fit before the file grows.
//
// Errors: ENOSPC -> kNoSpace, EIO and short I/O -> kIOError, checksum mismatch -> kCorruption. A
// failed Write leaves nothing allocated; the caller keeps its data.
// Thread-safety: all methods may be called concurrently (allocation is locked; I/O is positional).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "core/status.h"
#include "env/env.h"

namespace mz {

struct SwapExtent {
  uint64_t off = 0;   // file offset (4096-aligned)
  uint64_t len = 0;   // allocated bytes (4096-aligned), 0 = none
  uint64_t size = 0;  // payload bytes
  uint64_t hash = 0;  // xxh64 of the payload
  // Which of its owner's files holds the extent: 0 its own swap file, 1 a read-only file adopted
  // as storage (a stored session, UnitTable::AdoptStored). SwapFile itself ignores it.
  uint8_t file = 0;
  bool valid() const { return len != 0; }
};

class SwapFile {
 public:
  // Creates (or truncates) path and writes the header. direct: use O_DIRECT where the FS allows.
  static Status Create(Env* env, const std::string& path, bool direct, std::unique_ptr<SwapFile>* out);
  // Opens an existing file read-only as a source of extents whose places and checksums the caller
  // knows (a stored session's chunks, runtime/session_file.h): Read*, Verify and mapping work as
  // for a swap file; Write fails (kInvalidArgument), Free does nothing, and the destructor closes
  // the file without removing it. The file may be renamed over or unlinked meanwhile: the open
  // descriptor keeps the bytes it had.
  static Status OpenReadOnly(Env* env, const std::string& path, bool direct, std::unique_ptr<SwapFile>* out);
  ~SwapFile();  // closes the file and removes it (not a read-only one)

  Status Write(const void* data, size_t n, SwapExtent* out);
  // Reads extent e into dst (>= e.size bytes) and verifies its checksum.
  Status Read(const SwapExtent& e, void* dst) const;
  // As Read, into a buffer of at least e.len bytes aligned to kDirectIoAlign: read in place with
  // direct I/O (no bounce buffer); bytes past e.size are unspecified.
  Status ReadPadded(const SwapExtent& e, void* dst) const;
  // Reads n extents that lie back to back in the file (e[i].off + e[i].len == e[i + 1].off) with
  // one request, extent i into dst[i] (as ReadPadded: aligned, at least e[i].len bytes), then
  // verifies each checksum into each[i] (OK or kCorruption). Returns non-OK, and sets no each[i],
  // for bad arguments or an I/O error (then no dst holds valid data); OK means each[] tells.
  Status ReadPaddedRun(const SwapExtent* e, void* const* dst, int n, Status* each) const;
  // Checks that data (e.size bytes, e.g. a mapping of the extent) matches e's checksum:
  // kCorruption if not.
  Status Verify(const SwapExtent& e, const void* data) const;
  void Free(const SwapExtent& e);

  uint64_t used_bytes() const;   // bytes in live extents
  uint64_t file_bytes() const;   // current end of file
  bool direct() const { return file_->direct(); }
  bool read_only() const { return read_only_; }
  const std::string& path() const { return path_; }
  // The open swap file, for mapping extents and page-cache advice through Env (owned here; valid
  // for the SwapFile's lifetime).
  File* file() const { return file_.get(); }

  static constexpr uint64_t kHeaderBytes = 4096;

 private:
  SwapFile(Env* env, std::string path, std::unique_ptr<File> f) : env_(env), path_(std::move(path)), file_(std::move(f)) {}
  uint64_t Allocate(uint64_t len);
  void Release(uint64_t off, uint64_t len);

  Env* env_;
  std::string path_;
  std::unique_ptr<File> file_;
  mutable std::mutex mu_;
  std::map<uint64_t, uint64_t> free_;  // offset -> length
  uint64_t end_ = kHeaderBytes;
  uint64_t used_ = 0;
  bool read_only_ = false;
};

}  // namespace mz
