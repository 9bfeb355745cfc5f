#include "store/remote_kv.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <map>

#if MZ_HAVE_HIREDIS
#include <hiredis/hiredis.h>

#include <cstring>

#include "env/env.h"
#include "store/resp_reply.h"
#include "store/tls_stream.h"
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
  out->tls = url.rfind("rediss://", 0) == 0;
  const std::string scheme = out->tls ? "rediss://" : "redis://";
  if (url.rfind(scheme, 0) != 0)
    return Status::InvalidArgument("remote '" + shown + "': expected redis[s]://[user[:password]@]host:port[/db]");
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

// A reply that is not a bulk string, as hiredis parsed it (nullptr for a bulk string: its callers
// check the type, and Bad names it).
const redisReply* R(const RespReply& x) { return x.reply.get(); }

class RedisKv : public RemoteKv {
 public:
  RedisKv(const RedisOptions& o, std::unique_ptr<TlsClient> tls)
      : o_(o), env_(o.env ? o.env : Env::Default()), tls_(std::move(tls)) {}

  Status Get(const std::vector<std::string>& keys, std::vector<std::optional<std::string>>* values) override {
    values->clear();
    std::vector<std::vector<std::string>> cmds;
    for (const auto& k : keys) cmds.push_back({"GET", k});
    std::vector<RespReply> r;
    MZ_RETURN_IF_ERROR(Pipeline(cmds, &r));
    for (auto& x : r) {
      if (x.is_bulk()) values->emplace_back(std::move(x.bulk));
      else if (x.reply->type == REDIS_REPLY_NIL) values->emplace_back(std::nullopt);
      else return Bad("GET", R(x));
    }
    return Status::Ok();
  }

  Status GetRange(const std::vector<std::string>& keys, const std::vector<std::pair<uint64_t, uint64_t>>& ranges,
                  std::vector<std::string>* values, std::vector<uint64_t>* sizes) override {
    if (sizes) sizes->clear();
    std::vector<std::vector<std::string>> cmds;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (ranges[i].second == 0) cmds.push_back({"GETRANGE", keys[i], "1", "0"});  // empty
      else
        cmds.push_back({"GETRANGE", keys[i], std::to_string(ranges[i].first),
                        std::to_string(ranges[i].first + ranges[i].second - 1)});
      if (sizes) cmds.push_back({"STRLEN", keys[i]});
    }
    // The caller's strings lend their buffers to the replies: a caller that passes the same vector
    // again (the stream, layer after layer) reads into pages it already has.
    values->resize(keys.size());
    std::vector<RespReply> r(cmds.size());
    for (size_t i = 0; i < keys.size(); ++i) r[sizes ? 2 * i : i].bulk.swap((*values)[i]);
    values->clear();
    MZ_RETURN_IF_ERROR(Pipeline(cmds, &r));
    for (size_t i = 0; i < r.size(); ++i) {
      const redisReply* x = R(r[i]);
      if (sizes && i % 2 == 1) {
        if (!x || x->type != REDIS_REPLY_INTEGER) return Bad("STRLEN", x);
        sizes->push_back(uint64_t(x->integer));
      } else {
        if (x) return Bad("GETRANGE", x);
        values->push_back(std::move(r[i].bulk));
      }
    }
    return Status::Ok();
  }

  Status Exists(const std::vector<std::string>& keys, std::vector<bool>* out) override {
    out->clear();
    std::vector<std::vector<std::string>> cmds;
    for (const auto& k : keys) cmds.push_back({"EXISTS", k});
    std::vector<RespReply> r;
    MZ_RETURN_IF_ERROR(Pipeline(cmds, &r));
    for (auto& x : r) {
      if (x.is_bulk() || x.reply->type != REDIS_REPLY_INTEGER) return Bad("EXISTS", R(x));
      out->push_back(x.reply->integer > 0);
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
    std::vector<RespReply> r;
    MZ_RETURN_IF_ERROR(Pipeline({cmd}, &r));
    const redisReply* x = R(r[0]);
    if (!x) return Bad("SET", x);
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
    std::vector<RespReply> r;
    MZ_RETURN_IF_ERROR(Pipeline(cmds, &r));
    for (auto& x : r)
      if (x.is_bulk() || x.reply->type != REDIS_REPLY_INTEGER) return Bad("EXPIRE", R(x));
    return Status::Ok();
  }

  Status Remove(const std::vector<std::string>& keys) override {
    std::vector<std::vector<std::string>> cmds;
    for (const auto& k : keys) cmds.push_back({"DEL", k});
    std::vector<RespReply> r;
    MZ_RETURN_IF_ERROR(Pipeline(cmds, &r));
    for (auto& x : r)
      if (x.is_bulk() || x.reply->type != REDIS_REPLY_INTEGER) return Bad("DEL", R(x));
    return Status::Ok();
  }

  Status Ping() override {
    std::vector<RespReply> r;
    MZ_RETURN_IF_ERROR(Pipeline({{"PING"}}, &r));
    if (r[0].is_bulk() || r[0].reply->type != REDIS_REPLY_STATUS) return Bad("PING", R(r[0]));
    return Status::Ok();
  }

  Status Census(const std::string& pattern, uint64_t* keys, uint64_t* bytes) override {
    *keys = *bytes = 0;
    if (!cluster_checked_.exchange(true)) (void)LoadSlots();  // a cluster: every master is scanned
    for (const std::string& node : Masters()) MZ_RETURN_IF_ERROR(CensusAt(node, pattern, keys, bytes));
    return Status::Ok();
  }

  Status CensusAt(const std::string& node, const std::string& pattern, uint64_t* keys, uint64_t* bytes) {
    std::string cursor = "0";
    do {
      std::vector<RespReply> r;
      MZ_RETURN_IF_ERROR(PipelineAt(node, {{"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"}}, &r));
      const redisReply* x = R(r[0]);
      if (!x || x->type != REDIS_REPLY_ARRAY || x->elements != 2 || x->element[0]->type != REDIS_REPLY_STRING ||
          x->element[1]->type != REDIS_REPLY_ARRAY)
        return Bad("SCAN", x);
      cursor.assign(x->element[0]->str, size_t(x->element[0]->len));
      std::vector<std::vector<std::string>> cmds;
      for (size_t i = 0; i < x->element[1]->elements; ++i) {
        const redisReply* k = x->element[1]->element[i];
        cmds.push_back({"STRLEN", std::string(k->str, size_t(k->len))});
      }
      std::vector<RespReply> lens;
      MZ_RETURN_IF_ERROR(Pipeline(cmds, &lens));
      for (auto& l : lens) {
        if (l.is_bulk() || l.reply->type != REDIS_REPLY_INTEGER) return Bad("STRLEN", R(l));
        ++*keys;
        *bytes += uint64_t(l.reply->integer);
      }
    } while (cursor != "0");
    return Status::Ok();
  }

  std::string Describe() const override {
    return Scheme() + o_.url.host + ":" + std::to_string(o_.url.port) + (o_.url.db ? "/" + std::to_string(o_.url.db) : "");
  }

 private:
  // x: nullptr for a bulk string where another reply was expected.
  Status Bad(const char* cmd, const redisReply* x) const {
    std::string why = !x                              ? std::string("unexpected bulk string reply")
                      : x->type == REDIS_REPLY_ERROR ? std::string(x->str, size_t(x->len))
                                                     : "unexpected reply type " + std::to_string(x->type);
    return Status::IOError(Describe() + ": " + cmd + ": " + why);
  }

  const char* Scheme() const { return o_.url.tls ? "rediss://" : "redis://"; }

  // ---- connections: a pool per node ("host:port"; one node unless the store is a cluster) ----
  // One connection: its socket (the Env's, under TLS for rediss://) and hiredis's reader of its
  // replies. Used by one thread at a time (Acquire .. Return).
  struct Conn {
    std::unique_ptr<Socket> sock;
    redisReader* reader = nullptr;
    std::string out;    // the pipeline being sent (its buffer reused while small)
    bool fresh = true;  // no reply read yet: a failure then may be a plain / TLS mismatch
    ~Conn() {
      if (reader) redisReaderFree(reader);
    }
  };
  struct Node {
    std::string host;
    int port = 0;
    std::vector<std::unique_ptr<Conn>> idle;
    int open = 0;
  };
  static std::string Addr(const std::string& host, int port) { return host + ":" + std::to_string(port); }

  Node& NodeLocked(const std::string& addr) {
    Node& n = nodes_[addr];
    if (n.host.empty()) {
      const size_t colon = addr.rfind(':');
      n.host = addr.substr(0, colon);
      n.port = std::atoi(addr.c_str() + colon + 1);
    }
    return n;
  }

  // A connection to addr: an idle one, else a new one (AUTH, SELECT), else waits for one to come back.
  Status Acquire(const std::string& addr, std::unique_ptr<Conn>* out) {
    std::string host;
    int port;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] {
        Node& n = NodeLocked(addr);
        return !n.idle.empty() || n.open < std::max(1, o_.max_connections);
      });
      Node& n = NodeLocked(addr);
      if (!n.idle.empty()) {
        *out = std::move(n.idle.back());
        n.idle.pop_back();
        return Status::Ok();
      }
      n.open++;
      host = n.host;
      port = n.port;
    }
    Status st = Connect(host, port, out);
    if (!st.ok()) {
      std::lock_guard<std::mutex> lk(mu_);
      NodeLocked(addr).open--;
      cv_.notify_all();
    }
    return st;
  }

  void Return(const std::string& addr, std::unique_ptr<Conn> c, bool broken) {
    std::lock_guard<std::mutex> lk(mu_);
    Node& n = NodeLocked(addr);
    if (broken) {
      c.reset();
      n.open--;
    } else {
      n.idle.push_back(std::move(c));
    }
    cv_.notify_all();
  }

  // A new connection: TCP through the Env (TLS over it for rediss://), then AUTH and SELECT.
  Status Connect(const std::string& host, int port, std::unique_ptr<Conn>* out) {
    const std::string where = Scheme() + Addr(host, port);
    auto c = std::make_unique<Conn>();
    c->reader = redisReaderCreate();
    if (!c->reader) return Status::NoMemory("a Redis reply reader");
    if (tls_) MZ_RETURN_IF_ERROR(tls_->Connect(host, port, o_.timeout_ms, &c->sock));
    else MZ_RETURN_IF_ERROR(env_->ConnectTcp(host, port, o_.timeout_ms, &c->sock));
    std::vector<std::vector<std::string>> setup;
    std::vector<const char*> what;
    if (!o_.url.password.empty()) {
      setup.push_back(o_.url.user.empty() ? std::vector<std::string>{"AUTH", o_.url.password}
                                          : std::vector<std::string>{"AUTH", o_.url.user, o_.url.password});
      what.push_back("AUTH");
    }
    if (o_.url.db != 0) {
      setup.push_back({"SELECT", std::to_string(o_.url.db)});
      what.push_back("SELECT");
    }
    std::vector<RespReply> r;
    MZ_RETURN_IF_ERROR(Exchange(c.get(), setup, &r).With(where));
    for (size_t i = 0; i < r.size(); ++i)
      if (!r[i].is_bulk() && r[i].reply->type == REDIS_REPLY_ERROR)
        return Status::IOError(where + ": " + what[i] + ": " + std::string(r[i].reply->str, size_t(r[i].reply->len)));
    *out = std::move(c);
    return Status::Ok();
  }

  // cmds in one write (formatted by hiredis), then their replies read in order (ReadRespReply:
  // bulk strings straight from the socket, or TLS's decrypted stream, into their string). A
  // server error reply is returned as a reply. Errors: the socket's (the connection is then out
  // of step: the caller drops it). A plain connection whose first reply fails (closed, or bytes
  // that are not RESP: a TLS server's alert) says that the port may be a TLS one.
  Status Exchange(Conn* c, const std::vector<std::vector<std::string>>& cmds, std::vector<RespReply>* out) {
    out->resize(cmds.size());
    if (cmds.empty()) return Status::Ok();
    c->out.clear();
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const auto& cmd : cmds) {
      argv.clear();
      lens.clear();
      for (const auto& a : cmd) {
        argv.push_back(a.data());
        lens.push_back(a.size());
      }
      char* buf = nullptr;
      const int len = redisFormatCommandArgv(&buf, int(argv.size()), argv.data(), lens.data());
      if (len < 0 || !buf) return Status::NoMemory("a Redis command");
      c->out.append(buf, size_t(len));
      redisFreeCommand(buf);
    }
    Status st = c->sock->WriteAll(c->out.data(), c->out.size());
    if (c->out.capacity() > (1u << 20)) std::string().swap(c->out);  // a large PUT's copy is not kept
    Socket* sock = c->sock.get();
    const RespSource src = [sock](char* buf, size_t cap, size_t* got) { return sock->ReadSome(buf, cap, got); };
    for (size_t i = 0; st.ok() && i < cmds.size(); ++i) {
      st = ReadRespReply(c->reader, src, &(*out)[i]);
      if (!st.ok() && c->fresh && !o_.url.tls)
        st = Status::IOError(st.message() + " (is it a TLS port? then use rediss://)");
      c->fresh = false;
    }
    return st;
  }

  // cmds sent to node addr in one pipeline, then every reply read (Exchange). A connection error
  // or a malformed reply drops the connection (the next call makes a new one); a server error
  // reply is returned as a reply. (*out)[i].bulk's buffer, when the caller put one there, is
  // reused for reply i (no new pages).
  Status PipelineAt(const std::string& addr, const std::vector<std::vector<std::string>>& cmds,
                    std::vector<RespReply>* out) {
    if (cmds.empty()) {
      out->clear();
      return Status::Ok();
    }
    std::unique_ptr<Conn> c;
    MZ_RETURN_IF_ERROR(Acquire(addr, &c));
    Status st = Exchange(c.get(), cmds, out);
    if (!st.ok()) st = st.With(Scheme() + addr);
    Return(addr, std::move(c), !st.ok());
    if (!st.ok()) out->clear();
    return st;
  }

  // ---- Redis Cluster: slots, the slot map, redirections ----
  // The key's hash slot (CRC16-XMODEM of its hash tag, the part in the first {...} when not empty,
  // else of the whole key; mod 16384), as Redis Cluster computes it.
  static int Slot(const std::string& key) {
    size_t a = key.find('{'), len = key.size(), from = 0;
    if (a != std::string::npos) {
      const size_t b = key.find('}', a + 1);
      if (b != std::string::npos && b > a + 1) {
        from = a + 1;
        len = b - a - 1;
      }
    }
    uint16_t crc = 0;
    for (size_t i = from; i < from + len; ++i) {
      crc ^= uint16_t(uint8_t(key[i])) << 8;
      for (int k = 0; k < 8; ++k) crc = (crc & 0x8000) ? uint16_t((crc << 1) ^ 0x1021) : uint16_t(crc << 1);
    }
    return crc & 16383;
  }

  // The node serving cmd: keyless commands (PING, SCAN) and every command outside a cluster go
  // to the URL's node; in a cluster, the slot map's master of the key's slot.
  std::string Route(const std::vector<std::string>& cmd) {
    const std::string seed = Addr(o_.url.host, o_.url.port);
    if (cmd.size() < 2 || cmd[0] == "SCAN" || cmd[0] == "PING") return seed;
    std::lock_guard<std::mutex> lk(mu_);
    if (!cluster_) return seed;
    const std::string& n = slots_[size_t(Slot(cmd[1]))];
    return n.empty() ? seed : n;
  }

  // CLUSTER SLOTS from the URL's node (else any known master): the master of every slot.
  Status LoadSlots() {
    std::vector<std::string> from = {Addr(o_.url.host, o_.url.port)};
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (const auto& n : slots_)
        if (!n.empty() && std::find(from.begin(), from.end(), n) == from.end()) from.push_back(n);
    }
    Status last;
    for (const auto& addr : from) {
      std::vector<RespReply> r;
      last = PipelineAt(addr, {{"CLUSTER", "SLOTS"}}, &r);
      if (!last.ok()) continue;
      const redisReply* x = R(r[0]);
      if (!x || x->type != REDIS_REPLY_ARRAY) return Bad("CLUSTER SLOTS", x);
      std::vector<std::string> map(16384);
      for (size_t i = 0; i < x->elements; ++i) {
        const redisReply* e = x->element[i];
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 || e->element[2]->type != REDIS_REPLY_ARRAY ||
            e->element[2]->elements < 2)
          return Bad("CLUSTER SLOTS", e);
        const redisReply* m = e->element[2];
        std::string host(m->element[0]->str ? m->element[0]->str : "", m->element[0]->str ? size_t(m->element[0]->len) : 0);
        if (host.empty() || host == "?") host = addr.substr(0, addr.rfind(':'));  // "the node you asked"
        const std::string target = Addr(host, int(m->element[1]->integer));
        for (long long sl = e->element[0]->integer; sl <= e->element[1]->integer && sl < 16384; ++sl)
          if (sl >= 0) map[size_t(sl)] = target;
      }
      std::lock_guard<std::mutex> lk(mu_);
      slots_.swap(map);
      cluster_ = true;
      return Status::Ok();
    }
    return last;
  }

  // Every command in one pipeline per node (routed by the slot map), then every reply. A MOVED
  // reply (the slot lives elsewhere: a cluster, or its map changed) reloads the slot map and
  // sends the command to the node it names; an ASK reply (the slot is migrating) sends ASKING
  // then the command to the node it names, once. At most 5 rounds of redirections.
  // (*out)[i].bulk's buffer, when the caller put one there, is lent to command i's reply.
  Status Pipeline(const std::vector<std::vector<std::string>>& cmds, std::vector<RespReply>* out) {
    out->resize(cmds.size());
    for (auto& x : *out) x.reply.reset();
    std::vector<std::string> to(cmds.size());
    std::vector<bool> ask(cmds.size(), false);
    for (size_t i = 0; i < cmds.size(); ++i) to[i] = Route(cmds[i]);
    std::vector<size_t> todo(cmds.size());
    for (size_t i = 0; i < cmds.size(); ++i) todo[i] = i;
    for (int round = 0; !todo.empty(); ++round) {
      if (round == 6) return Status::IOError(Describe() + ": too many cluster redirections");
      std::map<std::string, std::vector<size_t>> by;
      for (size_t i : todo) by[to[i]].push_back(i);
      std::vector<size_t> again;
      bool moved = false;
      for (const auto& g : by) {
        std::vector<std::vector<std::string>> batch;
        for (size_t i : g.second) {
          if (ask[i]) batch.push_back({"ASKING"});
          batch.push_back(cmds[i]);
        }
        std::vector<RespReply> r(batch.size());
        for (size_t i = 0, k = 0; i < g.second.size(); ++i, ++k) {
          if (ask[g.second[i]]) ++k;
          r[k].bulk.swap((*out)[g.second[i]].bulk);
        }
        Status st = PipelineAt(g.first, batch, &r);
        if (!st.ok()) {
          out->clear();
          return st;
        }
        size_t k = 0;
        for (size_t i : g.second) {
          if (ask[i]) ++k;  // ASKING's +OK
          RespReply& x = r[k++];
          ask[i] = false;
          if (!x.is_bulk() && x.reply->type == REDIS_REPLY_ERROR && x.reply->len > 4) {
            const std::string e(x.reply->str, size_t(x.reply->len));
            const bool is_moved = e.rfind("MOVED ", 0) == 0, is_ask = e.rfind("ASK ", 0) == 0;
            if (is_moved || is_ask) {
              const size_t sp = e.rfind(' ');
              to[i] = e.substr(sp + 1);
              ask[i] = is_ask;
              moved = moved || is_moved;
              again.push_back(i);
              continue;
            }
          }
          (*out)[i] = std::move(x);
        }
      }
      if (moved) (void)LoadSlots();  // a failure keeps the addresses the replies named
      todo.swap(again);
    }
    return Status::Ok();
  }

  std::vector<std::string> Masters() {
    std::vector<std::string> m = {Addr(o_.url.host, o_.url.port)};
    std::lock_guard<std::mutex> lk(mu_);
    if (!cluster_) return m;
    m.clear();
    for (const auto& n : slots_)
      if (!n.empty() && std::find(m.begin(), m.end(), n) == m.end()) m.push_back(n);
    return m;
  }

  RedisOptions o_;
  Env* env_;
  std::unique_ptr<TlsClient> tls_;  // rediss:// only
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Node> nodes_;
  std::atomic<bool> cluster_checked_{false};
  bool cluster_ = false;            // a MOVED reply was seen: routed by slots_ since
  std::vector<std::string> slots_;  // slot -> its master's "host:port" (cluster_)
};

}  // namespace

Status OpenRedisKv(const RedisOptions& opts, std::unique_ptr<RemoteKv>* out, bool check_now) {
  std::unique_ptr<TlsClient> tls;
  if (opts.url.tls) {
    TlsOptions to;
    to.ca_file = opts.ca_file;
    to.cert_file = opts.cert_file;
    to.key_file = opts.key_file;
    MZ_RETURN_IF_ERROR(TlsClient::Create(opts.env ? opts.env : Env::Default(), to, &tls));
  } else if (!opts.ca_file.empty() || !opts.cert_file.empty() || !opts.key_file.empty()) {
    return Status::InvalidArgument("a CA, certificate or key file is for TLS: the remote's URL must then be rediss://");
  }
  auto kv = std::make_unique<RedisKv>(opts, std::move(tls));
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
