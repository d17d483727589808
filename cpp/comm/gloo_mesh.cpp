#include "comm/gloo_mesh.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <linux/filter.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/device.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <vector>

#include "core/errors.h"
#include "core/scheduling.h"

namespace accordion {

namespace {

// "ip:port" (IPv6: "[ip]:port"); empty for anything else.
std::string endpoint(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    const auto& a = reinterpret_cast<const sockaddr_in&>(ss);
    inet_ntop(AF_INET, &a.sin_addr, host, sizeof(host));
    return std::string(host) + ":" + std::to_string(ntohs(a.sin_port));
  }
  if (ss.ss_family == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6&>(ss);
    inet_ntop(AF_INET6, &a.sin6_addr, host, sizeof(host));
    return "[" + std::string(host) + "]:" + std::to_string(ntohs(a.sin6_port));
  }
  return "";
}

std::string endpointOf(const std::vector<char>& bytes) {
  return endpoint(gloo::transport::tcp::Address(bytes).getSockaddr());
}

struct SocketEnds {
  int fd;
  std::string local, remote;  // remote is empty for a socket that is not connected
  bool listening;
};

// This process's TCP/IP sockets with both their ends, read from /proc/self/fd. Gloo keeps its file
// descriptors to itself; the addresses tell which socket belongs to which pair.
std::vector<SocketEnds> sockets() {
  std::vector<SocketEnds> out;
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return out;
  while (dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    struct stat st;
    if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage self{}, peer{};
    socklen_t selfLen = sizeof(self), peerLen = sizeof(peer);
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&self), &selfLen) != 0) continue;
    SocketEnds ends{static_cast<int>(fd), endpoint(self), "", false};
    if (ends.local.empty()) continue;
    if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &peerLen) == 0) ends.remote = endpoint(peer);
    int accepting = 0;
    socklen_t len = sizeof(accepting);
    ends.listening = getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_ACCEPTCONN, &accepting, &len) == 0 && accepting;
    out.push_back(ends);
  }
  closedir(dir);
  return out;
}

// The remote ends of connections already taken in on the listening address `listening`.
std::vector<std::string> earlyOnPort(const std::string& listening) {
  std::vector<std::string> out;
  for (const auto& s : sockets())
    if (!s.listening && !s.remote.empty() && s.local == listening) out.push_back(s.remote);
  return out;
}

// A classic BPF socket filter that passes a TCP segment only when it carries no payload (SYN, ACK,
// FIN, RST): a connection opens, but its bytes are held back (the sender retransmits them) until
// the filter comes off. For TCP the program sees the segment from its TCP header on.
void holdPayload(int fd) {
  static sock_filter code[] = {
      BPF_STMT(BPF_LD | BPF_B | BPF_ABS, 12),        // data offset, in the high nibble
      BPF_STMT(BPF_ALU | BPF_AND | BPF_K, 0xf0),     //
      BPF_STMT(BPF_ALU | BPF_RSH | BPF_K, 2),        // TCP header length in bytes
      BPF_STMT(BPF_MISC | BPF_TAX, 0),               // X = header length
      BPF_STMT(BPF_LD | BPF_W | BPF_LEN, 0),         // A = segment length
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_X, 0, 0, 1),  // no payload: pass
      BPF_STMT(BPF_RET | BPF_K, 0xffffffff),         //
      BPF_STMT(BPF_RET | BPF_K, 0),                  // payload: drop
  };
  sock_fprog program{static_cast<unsigned short>(sizeof(code) / sizeof(code[0])), code};
  if (setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &program, sizeof(program)) != 0)
    throw EngineError("ERR_RENDEZVOUS", std::string("cannot attach a socket filter to a Gloo port: ") + std::strerror(errno));
}

void releasePayload(int fd) {
  int unused = 0;
  if (setsockopt(fd, SOL_SOCKET, SO_DETACH_FILTER, &unused, sizeof(unused)) != 0 && errno != ENOENT)
    throw EngineError("ERR_RENDEZVOUS", std::string("cannot detach the socket filter of a Gloo connection: ") + std::strerror(errno));
}

// One connection as its rank sees it.
struct Record {
  bool ok = false;
  bool accepted = false;  // the connection came in on this rank's port (else this rank opened it)
  std::string local, remote, error;
};

// connectFullMesh with every pair's listening port filtered, every pair tried even when another
// fails (so that no peer waits its whole timeout for a connection that will not come), and both
// ends of each connection recorded.
class MeshContext : public gloo::rendezvous::Context {
 public:
  using gloo::rendezvous::Context::Context;

  std::vector<Record> connectAll(gloo::rendezvous::Store& store, const std::shared_ptr<gloo::transport::Device>& device) {
    auto tc = device->createContext(rank, size);
    tc->setTimeout(getTimeout());
    std::vector<char> mine;
    // Each pair's listening address (a pair's own address changes to its connection's end).
    std::vector<std::string> listening(size);
    for (int peer = 0; peer < size; ++peer) {
      if (peer == rank) continue;
      auto bytes = tc->createPair(peer)->address().bytes();
      listening[peer] = endpointOf(bytes);
      bool held = false;
      for (const auto& s : sockets())
        if (s.listening && s.local == listening[peer]) {
          holdPayload(s.fd);
          held = true;
        }
      if (!held) throw EngineError("ERR_RENDEZVOUS", "Gloo's port for rank " + std::to_string(peer) + " was connected to before it could be guarded (a stray connection?)");
      mine.insert(mine.end(), bytes.begin(), bytes.end());
    }
    store.set(std::to_string(rank), mine);

    std::vector<Record> records(size);
    std::vector<std::string> announced(size);
    std::vector<std::vector<std::string>> early(size);
    for (int peer = 0; peer < size; ++peer) {
      if (peer == rank) continue;
      try {
        store.wait({std::to_string(peer)}, getTimeout());
        auto theirs = store.get(std::to_string(peer));
        const size_t each = theirs.size() / (size - 1);
        const size_t at = static_cast<size_t>(rank > peer ? rank - 1 : rank) * each;
        std::vector<char> address(theirs.begin() + at, theirs.begin() + at + each);
        announced[peer] = endpointOf(address);
        // Connections already taken in on this pair's port: the peer's, if this side listens, or
        // else strays, which Gloo closes as it opens its own connection to the peer.
        early[peer] = earlyOnPort(listening[peer]);
        tc->getPair(peer)->connect(address);
      } catch (const std::exception& e) {
        std::string message = *e.what() ? e.what() : "failed";
        for (char& c : message)
          if (c == '\n') c = ' ';
        records[peer].error = message;
      }
    }
    // Gloo made each connection from one side: the accepted socket on our pair's port, or the
    // socket we opened to the peer's announced port.
    const auto all = sockets();
    for (int peer = 0; peer < size; ++peer) {
      if (peer == rank || !records[peer].error.empty()) continue;
      for (const auto& s : all) {
        if (s.remote.empty() || records[peer].ok) continue;
        const bool accepted = s.local == listening[peer];
        if (!accepted && s.remote != announced[peer]) continue;
        records[peer] = {true, accepted, s.local, s.remote, ""};
        if (accepted) held_.push_back(s.fd);
      }
      if (!records[peer].ok) records[peer].error = "no socket joins this pair";
      if (records[peer].ok && !records[peer].accepted)
        for (const auto& from : early[peer])
          dropped_.push_back("rank " + std::to_string(rank) + " was reached by a stray connection from " + from + " on its port for rank " +
                             std::to_string(peer));
    }
    device_ = device;
    transportContext_ = std::move(tc);
    return records;
  }

  void release() {
    for (int fd : held_) releasePayload(fd);
  }

  // Stray connections that Gloo closed when it connected this rank's side of their pair.
  const std::vector<std::string>& dropped() const { return dropped_; }

 private:
  std::vector<int> held_;
  std::vector<std::string> dropped_;
};

std::string encode(const std::vector<Record>& records) {
  std::string out;
  for (size_t peer = 0; peer < records.size(); ++peer) {
    const auto& r = records[peer];
    if (!r.ok && r.error.empty()) continue;  // this rank itself
    out += std::to_string(peer) + (r.ok ? (r.accepted ? " accepted " : " opened ") + r.local + " " + r.remote : " fail " + r.error) + "\n";
  }
  return out;
}

std::vector<Record> decode(const std::vector<char>& bytes, int size) {
  std::vector<Record> out(size);
  std::istringstream lines(std::string(bytes.begin(), bytes.end()));
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream words(line);
    int peer = -1;
    std::string status;
    words >> peer >> status;
    if (peer < 0 || peer >= size) continue;
    if (status == "accepted" || status == "opened") {
      out[peer].ok = true;
      out[peer].accepted = status == "accepted";
      words >> out[peer].local >> out[peer].remote;
    } else {
      std::getline(words >> std::ws, out[peer].error);
    }
  }
  return out;
}

struct Verdict {
  std::vector<std::string> strays;    // "rank R: a stray connection from A took rank P's place"
  std::vector<std::string> failures;  // pairs that did not connect, with no stray to blame
  std::vector<std::string> mine;      // the strays that reached this rank, for its log line
};

// Every rank computes this from the same records, so all reach the same decision.
Verdict judge(const std::vector<std::vector<Record>>& seen, int self) {
  Verdict v;
  const int size = static_cast<int>(seen.size());
  for (int a = 0; a < size; ++a)
    for (int b = a + 1; b < size; ++b) {
      const Record& ab = seen[a][b];
      const Record& ba = seen[b][a];
      if (ab.ok && ba.ok && ab.local == ba.remote && ab.remote == ba.local) continue;
      bool stray = false;
      for (auto [x, y] : {std::pair{a, b}, std::pair{b, a}}) {
        const Record& mine = seen[x][y];
        const Record& theirs = seen[y][x];
        if (!mine.ok || !mine.accepted || (theirs.ok && theirs.local == mine.remote)) continue;
        stray = true;
        const std::string what = "rank " + std::to_string(x) + " was reached by a stray connection from " + mine.remote +
                                 " on its port for rank " + std::to_string(y);
        v.strays.push_back(what);
        if (x == self) v.mine.push_back(what);
      }
      if (!stray) {
        std::string what = "ranks " + std::to_string(a) + " and " + std::to_string(b) + " did not connect";
        for (const Record* r : {&ab, &ba})
          if (!r->ok) what += " [" + std::string(r == &ab ? "rank " + std::to_string(a) : "rank " + std::to_string(b)) + ": " + r->error + "]";
        v.failures.push_back(what);
      }
    }
  return v;
}

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : "; ") + item;
  return out;
}

// The device starts the transport's socket loop, which reads and writes every pair's connection.
std::shared_ptr<gloo::transport::Device> createDevice(const gloo::transport::tcp::attr& attr) {
  const BatchScheduling batch;  // inherited by the loop's thread
  return gloo::transport::tcp::CreateDevice(attr);
}

}  // namespace

std::shared_ptr<gloo::Context> connectMesh(const MeshOptions& o, gloo::rendezvous::Store& store) {
  gloo::transport::tcp::attr attr;
  attr.hostname = o.hostname;
  for (int attempt = 0;; ++attempt) {
    auto context = std::make_shared<MeshContext>(o.rank, o.size);
    context->setTimeout(o.timeout);
    if (o.size == 1) {
      context->connectAll(store, createDevice(attr));
      return context;
    }
    gloo::rendezvous::PrefixStore round(std::to_string(attempt), store);
    const std::vector<Record> records = context->connectAll(round, createDevice(attr));
    const std::string encoded = encode(records);
    round.set("ends/" + std::to_string(o.rank), std::vector<char>(encoded.begin(), encoded.end()));
    std::vector<std::vector<Record>> seen(o.size);
    for (int r = 0; r < o.size; ++r) {
      round.wait({"ends/" + std::to_string(r)}, o.timeout);
      seen[r] = decode(round.get("ends/" + std::to_string(r)), o.size);
    }
    const Verdict verdict = judge(seen, o.rank);
    if (!context->dropped().empty())
      std::fprintf(stderr, "accordion: %s; dropped it\n", joined(context->dropped()).c_str());
    if (verdict.strays.empty() && verdict.failures.empty()) {
      context->release();
      round.set("released/" + std::to_string(o.rank), {1});
      for (int r = 0; r < o.size; ++r) round.wait({"released/" + std::to_string(r)}, o.timeout);
      return context;
    }
    if (verdict.strays.empty())
      throw EngineError("ERR_RENDEZVOUS", "rank " + std::to_string(o.rank) + ": " + joined(verdict.failures));
    if (attempt + 1 >= o.attempts)
      throw EngineError("ERR_RENDEZVOUS", "rank " + std::to_string(o.rank) + ": stray connections took the workers' places on " +
                                              std::to_string(o.attempts) + " attempts: " + joined(verdict.strays));
    if (!verdict.mine.empty())
      std::fprintf(stderr, "accordion: %s; dropped it, connecting again on new ports\n", joined(verdict.mine).c_str());
  }
}

}  // namespace accordion
