// A plain hiredis client for tests: raw commands against the test server,
// to look at keys, play another process (e.g. JVM Simba) or kill our
// connections. Tests only; the backend has its own connection code.
#ifndef SIMBA_TESTS_REDIS_RAW_REDIS_H_
#define SIMBA_TESTS_REDIS_RAW_REDIS_H_

#include <hiredis/hiredis.h>
#include <poll.h>

#include <cerrno>
#include <chrono>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "simba/uri.h"

namespace simba::testing {

// A reply turned into plain values.
struct RawReply {
  int type = REDIS_REPLY_NIL;
  long long integer = 0;
  std::string str;  // string, status and error replies
  std::vector<RawReply> elements;

  bool nil() const { return type == REDIS_REPLY_NIL; }
  bool error() const { return type == REDIS_REPLY_ERROR; }
};

class RawRedis {
 public:
  // `uri` as given to the backend (redis://host:port[/db][?...]).
  explicit RawRedis(const std::string& uri) {
    auto parsed = Uri::parse(uri);
    if (!parsed.ok() || parsed->hosts.empty()) throw std::runtime_error("bad uri " + uri);
    const UriHost& host = parsed->hosts.front();
    timeval timeout{5, 0};
    context_.reset(redisConnectWithTimeout(host.host.c_str(), host.port.value_or(6379), timeout));
    if (!context_ || context_->err != 0) {
      throw std::runtime_error("cannot connect to " + uri + ": " +
                               (context_ ? context_->errstr : "no memory"));
    }
    redisSetTimeout(context_.get(), timeout);
  }

  RawReply call(const std::vector<std::string>& args) {
    std::vector<const char*> argv;
    std::vector<size_t> lengths;
    for (const auto& a : args) {
      argv.push_back(a.data());
      lengths.push_back(a.size());
    }
    void* reply = redisCommandArgv(context_.get(), static_cast<int>(argv.size()), argv.data(),
                                   lengths.data());
    if (reply == nullptr) throw std::runtime_error(std::string("redis: ") + context_->errstr);
    RawReply out = convert(static_cast<redisReply*>(reply));
    freeReplyObject(reply);
    return out;
  }

  // For a subscribed connection: the next pushed message, or nullopt-like
  // (type NIL) after the timeout.
  RawReply next(int timeout_ms) {
    timeval timeout{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    redisSetTimeout(context_.get(), timeout);
    void* reply = nullptr;
    RawReply out;
    if (redisGetReply(context_.get(), &reply) == REDIS_OK && reply != nullptr) {
      out = convert(static_cast<redisReply*>(reply));
      freeReplyObject(reply);
    } else {
      // A timeout leaves the context unusable in hiredis 0.14: reconnect is
      // the caller's business (tests use a fresh RawRedis per subscription).
      context_->err = 0;
    }
    return out;
  }

  // For a subscribed connection: the next pushed message if one arrives
  // within `timeout_ms`, else nullopt. Unlike next() this waits with poll(2),
  // so hiredis never times out and the connection stays usable after a
  // timeout (a reader thread can wait in short slices and still notice that
  // it should stop). Throws when the connection fails.
  std::optional<RawReply> poll(int timeout_ms) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      void* reply = nullptr;
      if (redisGetReplyFromReader(context_.get(), &reply) != REDIS_OK) {
        throw std::runtime_error(std::string("redis: ") + context_->errstr);
      }
      if (reply != nullptr) {
        RawReply out = convert(static_cast<redisReply*>(reply));
        freeReplyObject(reply);
        return out;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            until - std::chrono::steady_clock::now())
                            .count();
      if (left <= 0) return std::nullopt;
      pollfd p{context_->fd, POLLIN, 0};
      const int ready = ::poll(&p, 1, static_cast<int>(left));
      if (ready < 0 && errno == EINTR) continue;
      if (ready < 0) throw std::runtime_error("redis: poll failed");
      if (ready == 0) return std::nullopt;
      if (redisBufferRead(context_.get()) != REDIS_OK) {
        throw std::runtime_error(std::string("redis: ") + context_->errstr);
      }
    }
  }

  // Writes out what send() queued (Send only buffers it); blocks until done.
  void flush() {
    int done = 0;
    do {
      if (redisBufferWrite(context_.get(), &done) != REDIS_OK) {
        throw std::runtime_error(std::string("redis: ") + context_->errstr);
      }
    } while (done == 0);
  }

  void send(const std::vector<std::string>& args) {
    std::vector<const char*> argv;
    std::vector<size_t> lengths;
    for (const auto& a : args) {
      argv.push_back(a.data());
      lengths.push_back(a.size());
    }
    redisAppendCommandArgv(context_.get(), static_cast<int>(argv.size()), argv.data(),
                           lengths.data());
  }

 private:
  static RawReply convert(const redisReply* r) {
    RawReply out;
    out.type = r->type;
    out.integer = r->integer;
    if (r->str != nullptr) out.str.assign(r->str, r->len);
    for (size_t i = 0; i < r->elements; ++i) out.elements.push_back(convert(r->element[i]));
    return out;
  }

  struct Free {
    void operator()(redisContext* c) const { redisFree(c); }
  };
  std::unique_ptr<redisContext, Free> context_;
};

}  // namespace simba::testing

#endif  // SIMBA_TESTS_REDIS_RAW_REDIS_H_
