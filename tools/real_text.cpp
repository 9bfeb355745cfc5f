#include "tools/real_text.h"

#include <fstream>
#include <sstream>

#include "tools/bench_util.h"
#include "tools/common.h"

namespace mz::cli {

Status RealText(size_t min_bytes, std::string* out) {
  const std::string path = CacheDir() + "/text/kjv.txt";
  std::ifstream f(path);
  std::string text;
  if (f) {
    std::stringstream ss;
    ss << f.rdbuf();
    text = ss.str();
  } else {
    int rc = 0;
    // Strip the verse references ("Ge1:1 ") so the context is plain prose.
    text = RunCapture("bible -f 'gen1:1-rev22:21' 2>/dev/null | sed 's/^[^ ]* //'", &rc);
    if (rc == 0 && text.size() > 1000000) {
      WriteFile(CacheDir() + "/text", "kjv.txt", text);
    } else {
      text.clear();
      for (const char* p : {"/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/GPL-2",
                            "/usr/share/common-licenses/Apache-2.0"}) {
        std::ifstream g(p);
        std::stringstream ss;
        ss << g.rdbuf();
        text += ss.str();
      }
      if (text.empty()) return Status::IOError("no long text found: install bible-kjv (scripts/deps.sh does)");
    }
  }
  out->clear();
  while (out->size() < min_bytes) *out += text;
  return Status::Ok();
}

}  // namespace mz::cli
