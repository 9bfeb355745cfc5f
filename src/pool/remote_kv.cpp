#include "pool/remote_kv.h"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>

#if MZ_HAVE_HIREDIS
#include <hiredis/hiredis.h>
#include <sys/time.h>
#endif

namespace mz {

bool GlobMatch(const std::string& p, const std::string& s) {
  size_t i = 0, j = 0, star = std::string::npos, mark = 0;
  while (j < s.size()) {
    if (i < p.size() && (p[i] == '?' || p[i] == s[j])) {
      ++i;
      ++j;
    } else if (i < p.size() && p[i] == '*') {
      star = i++;
      mark = j;
    } else if (star != std::string::npos) {
      i = star + 1;
      j = ++mark;
    } else {
      return false;
    }
  }
  while (i < p.size() && p[i] == '*') ++i;
  return i == p.size();
}

namespace {
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
// url with its password (if any) masked: what error messages show.
std::string Redacted(const std::string& url) {
  const size_t scheme = url.find("://"), at = url.rfind('@');
  if (scheme == std::string::npos || at == std::string::npos || at < scheme) return url;
  const size_t colon = url.find(':', scheme + 3);
  if (colon == std::string::npos || colon > at) return url;
  return url.substr(0, colon + 1) + "***" + url.substr(at);
}
}  // namespace

Status ParseRemoteUrl(const std::string& url_in, RemoteUrl* out) {
  *out = RemoteUrl();
  const std::string& url = url_in;
  const std::string shown = Redacted(url_in);
  if (url.rfind("rediss://", 0) == 0)
    return Status::Unsupported("remote " + url.substr(0, 9) +
                               "...: TLS (rediss://) is not supported: this build's hiredis (Debian's 0.14) has "
                               "no TLS; use redis:// on a trusted network or a TLS tunnel (stunnel, spiped) to it");
  const std::string scheme = "redis://";
  if (url.rfind(scheme, 0) != 0)
    return Status::InvalidArgument("remote '" + shown + "': expected redis://[user[:password]@]host:port[/db]");
  std::string rest = url.substr(scheme.size());
  const size_t at = rest.rfind('@');
  if (at != std::string::npos) {
    const std::string cred = rest.substr(0, at);
    rest = rest.substr(at + 1);
    const size_t colon = cred.find(':');
    if (colon == std::string::npos) {
      out->user = cred;
    } else {
      out->user = cred.substr(0, colon);
      out->password = cred.substr(colon + 1);
    }
  }
  const size_t slash = rest.find('/');
  if (slash != std::string::npos) {
    const std::string db = rest.substr(slash + 1);
    rest = rest.substr(0, slash);
    if (!db.empty()) {
      if (db.size() > 4 || !std::all_of(db.begin(), db.end(), IsDigit))
        return Status::InvalidArgument("remote '" + shown + "': the database after '/' must be a number");
      out->db = std::atoi(db.c_str());
    }
  }
  std::string port;
  if (!rest.empty() && rest[0] == '[') {  // [IPv6]:port
    const size_t close = rest.find(']');
    if (close == std::string::npos) return Status::InvalidArgument("remote '" + shown + "': unclosed '['");
    out->host = rest.substr(1, close - 1);
    if (close + 1 < rest.size() && rest[close + 1] == ':') port = rest.substr(close + 2);
  } else {
    const size_t colon = rest.rfind(':');
    out->host = rest.substr(0, colon);
    if (colon != std::string::npos) port = rest.substr(colon + 1);
  }
  if (out->host.empty()) return Status::InvalidArgument("remote '" + shown + "': no host");
  if (!port.empty()) {
    if (port.size() > 5 || !std::all_of(port.begin(), port.end(), IsDigit) || std::atoi(port.c_str()) <= 0 ||
        std::atoi(port.c_str()) > 65535)
      return Status::InvalidArgument("remote '" + shown + "': bad port '" + port + "'");
    out->port = std::atoi(port.c_str());
  }
  return Status::Ok();
}

// ---- FakeRemoteKv ----

Status FakeRemoteKv::Get(const std::vector<std::string>& keys, std::vector<std::optional<std::string>>* values) {
  std::lock_guard<std::mutex> lk(mu_);
  calls_++;
  if (down_) return Status::IOError("fake remote: down");
  values->clear();
  for (const auto& k : keys) {
    auto it = kv_.find(k);
    values->push_back(it == kv_.end() ? std::nullopt : std::optional<std::string>(it->second));
  }
  return Status::Ok();
}

Status FakeRemoteKv::GetRange(const std::vector<std::string>& keys,
                              const std::vector<std::pair<uint64_t, uint64_t>>& ranges, std::vector<std::string>* values,
                              std::vector<uint64_t>* sizes) {
  std::unique_lock<std::mutex> lk(mu_);
  calls_++;
  const int n = range_calls_++;
  cv_.wait(lk, [&] { return hold_after_ < 0 || n < hold_after_ || down_; });
  if (down_) return Status::IOError("fake remote: down");
  values->clear();
  if (sizes) sizes->clear();
  for (size_t i = 0; i < keys.size(); ++i) {
    auto it = kv_.find(keys[i]);
    const std::string v = it == kv_.end() ? std::string() : it->second;
    values->push_back(ranges[i].first < v.size() ? v.substr(size_t(ranges[i].first), size_t(ranges[i].second)) : "");
    if (sizes) sizes->push_back(v.size());
  }
  return Status::Ok();
}

Status FakeRemoteKv::Exists(const std::vector<std::string>& keys, std::vector<bool>* out) {
  std::lock_guard<std::mutex> lk(mu_);
  calls_++;
  if (down_) return Status::IOError("fake remote: down");
  out->clear();
  for (const auto& k : keys) out->push_back(kv_.count(k) > 0);
  return Status::Ok();
}

Status FakeRemoteKv::Put(const std::string& key, const std::string& value, uint32_t, bool only_if_absent,
                         bool* written) {
  std::lock_guard<std::mutex> lk(mu_);
  calls_++;
  if (down_) return Status::IOError("fake remote: down");
  const bool w = !(only_if_absent && kv_.count(key));
  if (w) kv_[key] = value;
  if (written) *written = w;
  return Status::Ok();
}

Status FakeRemoteKv::Touch(const std::vector<std::string>&, uint32_t) {
  std::lock_guard<std::mutex> lk(mu_);
  calls_++;
  return down_ ? Status::IOError("fake remote: down") : Status::Ok();
}

Status FakeRemoteKv::Remove(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lk(mu_);
  calls_++;
  if (down_) return Status::IOError("fake remote: down");
  for (const auto& k : keys) kv_.erase(k);
  return Status::Ok();
}

Status FakeRemoteKv::Ping() {
  std::lock_guard<std::mutex> lk(mu_);
  calls_++;
  return down_ ? Status::IOError("fake remote: down") : Status::Ok();
}

Status FakeRemoteKv::Census(const std::string& pattern, uint64_t* keys, uint64_t* bytes) {
  std::lock_guard<std::mutex> lk(mu_);
  if (down_) return Status::IOError("fake remote: down");
  *keys = *bytes = 0;
  for (const auto& kv : kv_)
    if (GlobMatch(pattern, kv.first)) {
      ++*keys;
      *bytes += kv.second.size();
    }
  return Status::Ok();
}

void FakeRemoteKv::SetDown(bool down) {
  std::lock_guard<std::mutex> lk(mu_);
  down_ = down;
  cv_.notify_all();
}
void FakeRemoteKv::HoldRangesAfter(int after) {
  std::lock_guard<std::mutex> lk(mu_);
  hold_after_ = after;
  range_calls_ = 0;
}
void FakeRemoteKv::Release() {
  std::lock_guard<std::mutex> lk(mu_);
  hold_after_ = -1;
  cv_.notify_all();
}
int FakeRemoteKv::range_calls() {
  std::lock_guard<std::mutex> lk(mu_);
  return range_calls_;
}
std::map<std::string, std::string> FakeRemoteKv::Snapshot() {
  std::lock_guard<std::mutex> lk(mu_);
  return kv_;
}
void FakeRemoteKv::Set(const std::string& key, const std::string& value) {
  std::lock_guard<std::mutex> lk(mu_);
  kv_[key] = value;
}
void FakeRemoteKv::Erase(const std::string& key) {
  std::lock_guard<std::mutex> lk(mu_);
  kv_.erase(key);
}
uint64_t FakeRemoteKv::calls() {
  std::lock_guard<std::mutex> lk(mu_);
  return calls_;
}

// ---- RedisKv ----

#if MZ_HAVE_HIREDIS
namespace {

struct ReplyDeleter {
  void operator()(redisReply* r) const {
    if (r) freeReplyObject(r);
  }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

class RedisKv : public RemoteKv {
 public:
  explicit RedisKv(const RedisOptions& o) : o_(o) {}
  ~RedisKv() override {
    for (redisContext* c : idle_) redisFree(c);
  }

  Status Get(const std::vector<std::string>& keys, std::vector<std::optional<std::string>>* values) override {
    values->clear();
    std::vector<std::vector<std::string>> cmds;
    for (const auto& k : keys) cmds.push_back({"GET", k});
    std::vector<Reply> r;
    MZ_RETURN_IF_ERROR(Pipeline(cmds, &r));
    for (auto& x : r) {
      if (x->type == REDIS_REPLY_STRING) values->emplace_back(std::string(x->str, size_t(x->len)));
      else if (x->type == REDIS_REPLY_NIL) values->emplace_back(std::nullopt);
      else return Bad("GET", x.get());
    }
    return Status::Ok();
  }

  Status GetRange(const std::vector<std::string>& keys, const std::vector<std::pair<uint64_t, uint64_t>>& ranges,
                  std::vector<std::string>* values, std::vector<uint64_t>* sizes) override {
    values->clear();
    if (sizes) sizes->clear();
    std::vector<std::vector<std::string>> cmds;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (ranges[i].second == 0) cmds.push_back({"GETRANGE", keys[i], "1", "0"});  // empty
      else
        cmds.push_back({"GETRANGE", keys[i], std::to_string(ranges[i].first),
                        std::to_string(ranges[i].first + ranges[i].second - 1)});
      if (sizes) cmds.push_back({"STRLEN", keys[i]});
    }
    std::vector<Reply> r;
    MZ_RETURN_IF_ERROR(Pipeline(cmds, &r));
    for (size_t i = 0; i < r.size(); ++i) {
      const redisReply* x = r[i].get();
      if (sizes && i % 2 == 1) {
        if (x->type != REDIS_REPLY_INTEGER) return Bad("STRLEN", x);
        sizes->push_back(uint64_t(x->integer));
      } else {
        if (x->type != REDIS_REPLY_STRING) return Bad("GETRANGE", x);
        values->emplace_back(x->str, size_t(x->len));
      }
    }
    return Status::Ok();
  }

  Status Exists(const std::vector<std::string>& keys, std::vector<bool>* out) override {
    out->clear();
    std::vector<std::vector<std::string>> cmds;
    for (const auto& k : keys) cmds.push_back({"EXISTS", k});
    std::vector<Reply> r;
    MZ_RETURN_IF_ERROR(Pipeline(cmds, &r));
    for (auto& x : r) {
      if (x->type != REDIS_REPLY_INTEGER) return Bad("EXISTS", x.get());
      out->push_back(x->integer > 0);
    }
    return Status::Ok();
  }

  Status Put(const std::string& key, const std::string& value, uint32_t ttl_s, bool only_if_absent,
             bool* written) override {
    std::vector<std::string> cmd = {"SET", key, value};
    if (ttl_s > 0) {
      cmd.push_back("EX");
      cmd.push_back(std::to_string(ttl_s));
    }
    if (only_if_absent) cmd.push_back("NX");
    std::vector<Reply> r;
    MZ_RETURN_IF_ERROR(Pipeline({cmd}, &r));
    const redisReply* x = r[0].get();
    if (x->type == REDIS_REPLY_NIL) {  // NX and the key exists
      if (written) *written = false;
      return Status::Ok();
    }
    if (x->type != REDIS_REPLY_STATUS) return Bad("SET", x);
    if (written) *written = true;
    return Status::Ok();
  }

  Status Touch(const std::vector<std::string>& keys, uint32_t ttl_s) override {
    if (keys.empty()) return Status::Ok();
    std::vector<std::vector<std::string>> cmds;
    for (const auto& k : keys) {
      if (ttl_s > 0) cmds.push_back({"EXPIRE", k, std::to_string(ttl_s)});
      else cmds.push_back({"PERSIST", k});
    }
    std::vector<Reply> r;
    MZ_RETURN_IF_ERROR(Pipeline(cmds, &r));
    for (auto& x : r)
      if (x->type != REDIS_REPLY_INTEGER) return Bad("EXPIRE", x.get());
    return Status::Ok();
  }

  Status Remove(const std::vector<std::string>& keys) override {
    std::vector<std::vector<std::string>> cmds;
    for (const auto& k : keys) cmds.push_back({"DEL", k});
    std::vector<Reply> r;
    MZ_RETURN_IF_ERROR(Pipeline(cmds, &r));
    for (auto& x : r)
      if (x->type != REDIS_REPLY_INTEGER) return Bad("DEL", x.get());
    return Status::Ok();
  }

  Status Ping() override {
    std::vector<Reply> r;
    MZ_RETURN_IF_ERROR(Pipeline({{"PING"}}, &r));
    if (r[0]->type != REDIS_REPLY_STATUS) return Bad("PING", r[0].get());
    return Status::Ok();
  }

  Status Census(const std::string& pattern, uint64_t* keys, uint64_t* bytes) override {
    *keys = *bytes = 0;
    std::string cursor = "0";
    do {
      std::vector<Reply> r;
      MZ_RETURN_IF_ERROR(Pipeline({{"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"}}, &r));
      const redisReply* x = r[0].get();
      if (x->type != REDIS_REPLY_ARRAY || x->elements != 2 || x->element[0]->type != REDIS_REPLY_STRING ||
          x->element[1]->type != REDIS_REPLY_ARRAY)
        return Bad("SCAN", x);
      cursor.assign(x->element[0]->str, size_t(x->element[0]->len));
      std::vector<std::vector<std::string>> cmds;
      for (size_t i = 0; i < x->element[1]->elements; ++i) {
        const redisReply* k = x->element[1]->element[i];
        cmds.push_back({"STRLEN", std::string(k->str, size_t(k->len))});
      }
      std::vector<Reply> lens;
      MZ_RETURN_IF_ERROR(Pipeline(cmds, &lens));
      for (auto& l : lens) {
        if (l->type != REDIS_REPLY_INTEGER) return Bad("STRLEN", l.get());
        ++*keys;
        *bytes += uint64_t(l->integer);
      }
    } while (cursor != "0");
    return Status::Ok();
  }

  std::string Describe() const override {
    return "redis://" + o_.url.host + ":" + std::to_string(o_.url.port) + (o_.url.db ? "/" + std::to_string(o_.url.db) : "");
  }

 private:
  Status Bad(const char* cmd, const redisReply* x) const {
    std::string why = x->type == REDIS_REPLY_ERROR ? std::string(x->str, size_t(x->len)) : "unexpected reply type " + std::to_string(x->type);
    return Status::IOError(Describe() + ": " + cmd + ": " + why);
  }

  // A connection: an idle one, else a new one (AUTH, SELECT), else waits for one to come back.
  Status Acquire(redisContext** out) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return !idle_.empty() || open_ < std::max(1, o_.max_connections); });
      if (!idle_.empty()) {
        *out = idle_.back();
        idle_.pop_back();
        return Status::Ok();
      }
      open_++;
    }
    Status st = Connect(out);
    if (!st.ok()) {
      std::lock_guard<std::mutex> lk(mu_);
      open_--;
      cv_.notify_one();
    }
    return st;
  }

  void Return(redisContext* c, bool broken) {
    std::lock_guard<std::mutex> lk(mu_);
    if (broken) {
      redisFree(c);
      open_--;
    } else {
      idle_.push_back(c);
    }
    cv_.notify_one();
  }

  Status Connect(redisContext** out) {
    timeval tv{time_t(o_.timeout_ms / 1000), suseconds_t((o_.timeout_ms % 1000) * 1000)};
    redisContext* c = redisConnectWithTimeout(o_.url.host.c_str(), o_.url.port, tv);
    if (!c) return Status::NoMemory("a Redis connection");
    if (c->err) {
      Status st = Status::IOError("connecting to " + Describe() + ": " + c->errstr);
      redisFree(c);
      return st;
    }
    redisSetTimeout(c, tv);
    auto command = [&](const std::vector<std::string>& args, const std::string& what) -> Status {
      Reply r;
      MZ_RETURN_IF_ERROR(Send(c, {args}, nullptr));
      void* p = nullptr;
      if (redisGetReply(c, &p) != REDIS_OK)
        return Status::IOError(Describe() + ": " + what + ": " + (c->err ? c->errstr : "no reply"));
      r.reset(static_cast<redisReply*>(p));
      if (r->type == REDIS_REPLY_ERROR) return Status::IOError(Describe() + ": " + what + ": " + std::string(r->str, size_t(r->len)));
      return Status::Ok();
    };
    Status st;
    if (!o_.url.password.empty()) {
      st = o_.url.user.empty() ? command({"AUTH", o_.url.password}, "AUTH")
                               : command({"AUTH", o_.url.user, o_.url.password}, "AUTH");
    }
    if (st.ok() && o_.url.db != 0) st = command({"SELECT", std::to_string(o_.url.db)}, "SELECT");
    if (!st.ok()) {
      redisFree(c);
      return st;
    }
    *out = c;
    return Status::Ok();
  }

  static Status Send(redisContext* c, const std::vector<std::vector<std::string>>& cmds, void*) {
    for (const auto& cmd : cmds) {
      std::vector<const char*> argv;
      std::vector<size_t> lens;
      for (const auto& a : cmd) {
        argv.push_back(a.data());
        lens.push_back(a.size());
      }
      if (redisAppendCommandArgv(c, int(argv.size()), argv.data(), lens.data()) != REDIS_OK)
        return Status::IOError(std::string("queueing a Redis command: ") + c->errstr);
    }
    return Status::Ok();
  }

  // Every command sent in one pipeline, then every reply read. A connection error drops the
  // connection (the next call makes a new one); a server error reply is returned as a reply.
  Status Pipeline(const std::vector<std::vector<std::string>>& cmds, std::vector<Reply>* out) {
    out->clear();
    if (cmds.empty()) return Status::Ok();
    redisContext* c = nullptr;
    MZ_RETURN_IF_ERROR(Acquire(&c));
    Status st = Send(c, cmds, nullptr);
    for (size_t i = 0; st.ok() && i < cmds.size(); ++i) {
      void* p = nullptr;
      if (redisGetReply(c, &p) != REDIS_OK || !p) {
        st = Status::IOError(Describe() + ": " + (c->err ? c->errstr : "no reply"));
        break;
      }
      out->emplace_back(static_cast<redisReply*>(p));
    }
    Return(c, !st.ok());
    if (!st.ok()) out->clear();
    return st;
  }

  RedisOptions o_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<redisContext*> idle_;
  int open_ = 0;
};

}  // namespace

Status OpenRedisKv(const RedisOptions& opts, std::unique_ptr<RemoteKv>* out, bool check_now) {
  auto kv = std::make_unique<RedisKv>(opts);
  if (check_now) MZ_RETURN_IF_ERROR(kv->Ping());
  *out = std::move(kv);
  return Status::Ok();
}
#else
Status OpenRedisKv(const RedisOptions& opts, std::unique_ptr<RemoteKv>* out, bool) {
  return Status::Unsupported("a Redis remote tier: this build has no hiredis (install libhiredis-dev and rebuild)");
}
#endif

}  // namespace mz
