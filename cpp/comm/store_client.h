// Client of the job's rendezvous store: a small TCP key-value store hosted by the launcher or rank 0
// (ts/comm/store.ts is the server). Used to exchange Gloo addresses.
//
// Wire format, little-endian: request = u8 op, u32 key length, key, u32 value length, value;
// response = u8 status (0 ok, 1 error, 2 timeout), u32 length, payload.
// Ops: 0 hello (key = job token), 1 set, 2 get (value = u32 timeout in ms; waits for the key),
// 3 add (value = i64 delta; payload = i64 new value).
#pragma once
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace accordion {

class StoreClient {
 public:
  // Connects (retrying until `timeout`) and presents the job token; throws EngineError
  // ERR_RENDEZVOUS naming the address on failure. A reply is awaited at most `replyTimeout` beyond
  // the wait a request asks for (default 5 s); after a missing reply the client is unusable.
  StoreClient(const std::string& host, int port, const std::string& token, std::chrono::milliseconds timeout,
              std::chrono::milliseconds replyTimeout = std::chrono::milliseconds(5000));
  ~StoreClient();
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  void set(const std::string& key, const std::vector<char>& value);
  // Waits until the key exists (at most `timeout`).
  std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout);
  int64_t add(const std::string& key, int64_t delta);
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  std::vector<char> request(uint8_t op, const std::string& key, const std::vector<char>& value, const std::string& what);
  std::string where() const;
  int fd_ = -1;
  bool closed_ = false;  // the store closed the connection (or it broke)
  std::string host_;
  int port_;
  std::chrono::milliseconds timeout_, replyTimeout_;
  std::mutex mutex_;
};

}  // namespace accordion
