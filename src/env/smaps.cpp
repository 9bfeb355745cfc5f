#include "env/smaps.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>

namespace mz {
namespace {

// Unsigned integer of base `base` filling all of s; false if s is empty, not a number or too large.
bool ParseU64(const std::string& s, int base, uint64_t* out) {
  if (s.empty() || s[0] == '-' || s[0] == '+' || std::isspace(static_cast<unsigned char>(s[0]))) return false;
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s.c_str(), &end, base);
  if (errno != 0 || end != s.c_str() + s.size()) return false;
  *out = uint64_t(v);
  return true;
}

// Splits off the next whitespace-separated token of s from *pos.
std::string NextToken(const std::string& s, size_t* pos) {
  size_t a = *pos;
  while (a < s.size() && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  size_t b = a;
  while (b < s.size() && !std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  *pos = b;
  return s.substr(a, b - a);
}

// The smaps field the key feeds, nullptr if it is not used.
uint64_t* Field(SmapsVma& v, const std::string& key) {
  if (key == "Size") return &v.size;
  if (key == "Rss") return &v.rss;
  if (key == "Pss") return &v.pss;
  if (key == "Shared_Clean") return &v.shared_clean;
  if (key == "Shared_Dirty") return &v.shared_dirty;
  if (key == "Private_Clean") return &v.private_clean;
  if (key == "Private_Dirty") return &v.private_dirty;
  if (key == "Anonymous") return &v.anonymous;
  if (key == "Swap") return &v.swap;
  return nullptr;
}

}  // namespace

Status ParseSmaps(const std::string& text, std::vector<SmapsVma>* out) {
  out->clear();
  std::vector<SmapsVma> vmas;
  size_t pos = 0;
  int line_no = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    const std::string line = text.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    auto bad = [&](const std::string& why) {
      std::string shown = line.size() > 120 ? line.substr(0, 120) + "..." : line;
      return Status::Corruption(std::string(kSelfSmapsPath) + " line " + std::to_string(line_no) + ": " + why +
                                " ('" + shown + "')");
    };
    size_t p = 0;
    const std::string first = NextToken(line, &p);
    if (first.empty()) continue;  // blank line
    if (first.back() == ':') {    // "Key: value ..."
      if (vmas.empty()) return bad("a field before any mapping header");
      uint64_t* f = Field(vmas.back(), first.substr(0, first.size() - 1));
      if (!f) continue;  // a key this code does not use (VmFlags, THPeligible, newer kernels' keys)
      const std::string num = NextToken(line, &p), unit = NextToken(line, &p);
      uint64_t kb = 0;
      if (!ParseU64(num, 10, &kb) || unit != "kB" || !NextToken(line, &p).empty() || kb > (UINT64_MAX >> 10))
        return bad("expected '" + first + " N kB'");
      *f = kb << 10;
      continue;
    }
    // A header: start-end perms offset dev inode [path]
    const size_t dash = first.find('-');
    SmapsVma v;
    if (dash == std::string::npos || !ParseU64(first.substr(0, dash), 16, &v.start) ||
        !ParseU64(first.substr(dash + 1), 16, &v.end))
      return bad("neither a mapping header (start-end perms offset dev inode path) nor 'Key: value'");
    if (v.end < v.start) return bad("mapping ends before it starts");
    v.perms = NextToken(line, &p);
    const std::string off = NextToken(line, &p), dev = NextToken(line, &p), inode = NextToken(line, &p);
    if (v.perms.size() != 4 || !ParseU64(off, 16, &v.offset) || dev.find(':') == std::string::npos ||
        !ParseU64(inode, 10, &v.inode))
      return bad("malformed mapping header");
    while (p < line.size() && std::isspace(static_cast<unsigned char>(line[p]))) ++p;
    v.path = line.substr(p);
    if (!vmas.empty() && v.start < vmas.back().end) return bad("mappings out of address order or overlapping");
    vmas.push_back(std::move(v));
  }
  *out = std::move(vmas);
  return Status::Ok();
}

Status ReadSmaps(Env* env, std::vector<SmapsVma>* out) {
  out->clear();
  std::string text;
  MZ_RETURN_IF_ERROR(env->ReadSmallFile(kSelfSmapsPath, &text));
  return ParseSmaps(text, out);
}

size_t FirstVmaEndingAfter(const std::vector<SmapsVma>& vmas, uint64_t addr) {
  return size_t(std::upper_bound(vmas.begin(), vmas.end(), addr,
                                 [](uint64_t a, const SmapsVma& v) { return a < v.end; }) -
                vmas.begin());
}

}  // namespace mz
