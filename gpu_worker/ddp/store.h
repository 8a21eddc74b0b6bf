#pragma once

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace gradhub::ddp {

// Rendezvous stores wait this long unless told otherwise: long enough for every rank of a
// large job to be scheduled and start, short enough that a rank that never comes is noticed.
inline constexpr std::chrono::milliseconds kDefaultStoreTimeout = std::chrono::minutes(5);

// A key did not appear in time. The message names the keys and the timeout.
class StoreTimeoutError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The store could not be reached or failed (I/O error, server gone).
class StoreError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A small key-value store through which ranks find each other (c10d's Store, gloo's
// rendezvous::Store). Values are bytes. Every implementation is thread-safe, and a value once
// set is seen by every later Get on any rank.
//
// Backends: InMemoryStore (ranks as threads in one process), FileStore (processes on one
// machine), PrefixStore (scopes another store's keys), and the job API's StoreService
// client (processes anywhere).
class Store {
 public:
  virtual ~Store() = default;

  // Creates or overwrites `key`.
  virtual void Set(const std::string& key, const std::string& value) = 0;

  // The value of `key`, waiting for it to be set; StoreTimeoutError after `timeout`.
  virtual std::string Get(const std::string& key,
                          std::chrono::milliseconds timeout = kDefaultStoreTimeout) = 0;

  // Atomically adds `delta` to the integer counter `key` (0 when missing) and returns the new
  // value. Counters and values share the key space; Get of a counter returns its decimal text.
  virtual int64_t Add(const std::string& key, int64_t delta) = 0;

  // Returns once every key is set; StoreTimeoutError naming the missing ones after `timeout`.
  virtual void Wait(const std::vector<std::string>& keys,
                    std::chrono::milliseconds timeout = kDefaultStoreTimeout) = 0;

  // True when every key is set, without waiting.
  virtual bool Check(const std::vector<std::string>& keys) = 0;

  // Removes every key starting with `prefix`; returns how many were removed.
  virtual int64_t DeletePrefix(const std::string& prefix) = 0;
};

}  // namespace gradhub::ddp
