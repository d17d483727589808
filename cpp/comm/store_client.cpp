#include "comm/store_client.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "core/errors.h"

namespace accordion {

namespace {

EngineError rendezvousError(const std::string& message) { return EngineError("ERR_RENDEZVOUS", message); }

void appendU32(std::vector<char>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

}  // namespace

std::string StoreClient::where() const { return "the rendezvous store at " + host_ + ":" + std::to_string(port_); }

StoreClient::StoreClient(const std::string& host, int port, const std::string& token, std::chrono::milliseconds timeout,
                         std::chrono::milliseconds replyTimeout)
    : host_(host), port_(port), timeout_(timeout), replyTimeout_(replyTimeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string lastError = "no attempt";
  // Connects, retrying until the deadline (the store may not be up yet).
  auto open = [&] {
    while (fd_ < 0) {
      addrinfo hints{};
      hints.ai_family = AF_UNSPEC;
      hints.ai_socktype = SOCK_STREAM;
      addrinfo* result = nullptr;
      const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &result);
      if (rc != 0) throw rendezvousError("cannot resolve " + where() + ": " + gai_strerror(rc));
      for (addrinfo* ai = result; ai && fd_ < 0; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) continue;
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
          fd_ = fd;
        } else {
          lastError = std::strerror(errno);
          close(fd);
        }
      }
      freeaddrinfo(result);
      if (fd_ >= 0) break;
      if (std::chrono::steady_clock::now() >= deadline)
        throw rendezvousError("cannot reach " + where() + " within " + std::to_string(timeout.count()) + " ms (" + lastError +
                              "); is the master address right and rank 0 or the launcher running?");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    int one = 1;
    setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  };
  for (;;) {
    open();
    try {
      request(0, token, {}, "join the job");
      return;
    } catch (const EngineError&) {
      // A store that closes the connection unanswered may have too many strangers waiting: retry.
      if (!closed_ || std::chrono::steady_clock::now() >= deadline) throw;
    }
    close(fd_);
    fd_ = -1;
    closed_ = false;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

StoreClient::~StoreClient() {
  if (fd_ >= 0) close(fd_);
}

std::vector<char> StoreClient::request(uint8_t op, const std::string& key, const std::vector<char>& value, const std::string& what) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<char> message;
  message.push_back(static_cast<char>(op));
  appendU32(message, static_cast<uint32_t>(key.size()));
  message.insert(message.end(), key.begin(), key.end());
  appendU32(message, static_cast<uint32_t>(value.size()));
  message.insert(message.end(), value.begin(), value.end());
  for (size_t sent = 0; sent < message.size();) {
    const ssize_t n = send(fd_, message.data() + sent, message.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) {
      closed_ = true;
      throw rendezvousError("lost the connection to " + where() + " while trying to " + what);
    }
    sent += static_cast<size_t>(n);
  }
  if (closed_) throw rendezvousError("the connection to " + where() + " is broken; cannot " + what);
  // Replies to waiting gets can take up to their timeout; allow that plus a margin.
  const uint32_t wait = op == 2 && value.size() >= 4 ? static_cast<uint32_t>(static_cast<unsigned char>(value[0])) |
                                                           static_cast<uint32_t>(static_cast<unsigned char>(value[1])) << 8 |
                                                           static_cast<uint32_t>(static_cast<unsigned char>(value[2])) << 16 |
                                                           static_cast<uint32_t>(static_cast<unsigned char>(value[3])) << 24
                                                     : 0;
  auto receive = [&](char* out, size_t size) {
    for (size_t got = 0; got < size;) {
      pollfd p{fd_, POLLIN, 0};
      const int ready = poll(&p, 1, static_cast<int>(wait + replyTimeout_.count()));
      if (ready <= 0) {
        closed_ = true;  // a late reply would be taken for the next request's
        throw rendezvousError("no reply from " + where() + " while trying to " + what);
      }
      const ssize_t n = recv(fd_, out + got, size - got, 0);
      if (n <= 0) {
        closed_ = true;
        throw rendezvousError(where() + " closed the connection while we tried to " + what);
      }
      got += static_cast<size_t>(n);
    }
  };
  char header[5];
  receive(header, 5);
  uint32_t length = 0;
  for (int i = 0; i < 4; ++i) length |= static_cast<uint32_t>(static_cast<unsigned char>(header[1 + i])) << (8 * i);
  std::vector<char> payload(length);
  if (length) receive(payload.data(), length);
  const int status = static_cast<unsigned char>(header[0]);
  if (status == 2) throw rendezvousError("timed out after " + std::to_string(wait) + " ms waiting to " + what);
  if (status != 0) throw rendezvousError(where() + " refused to " + what + ": " + std::string(payload.begin(), payload.end()));
  return payload;
}

void StoreClient::set(const std::string& key, const std::vector<char>& value) { request(1, key, value, "set '" + key + "'"); }

std::vector<char> StoreClient::get(const std::string& key, std::chrono::milliseconds timeout) {
  std::vector<char> value;
  appendU32(value, static_cast<uint32_t>(timeout.count()));
  return request(2, key, value, "read '" + key + "'");
}

int64_t StoreClient::add(const std::string& key, int64_t delta) {
  std::vector<char> value(8);
  std::memcpy(value.data(), &delta, 8);
  std::vector<char> reply = request(3, key, value, "add to '" + key + "'");
  int64_t result = 0;
  if (reply.size() == 8) std::memcpy(&result, reply.data(), 8);
  return result;
}

}  // namespace accordion
