#pragma once
// ArenaMessage<M>: a protobuf message on an arena whose first 8 KiB are part of this object, for
// the requests and answers that carry a message per block (a GET's BlockInfo and its slot, a
// PUT_RESERVE's items and reservations). Building or parsing one then allocates nothing for the
// first few dozen blocks, where a heap message costs a malloc and a free per block and per
// nested slot; larger ones grow the arena from the heap.
//
// Meant for the stack of the call that handles one frame: the message (and anything taken from
// it by pointer or reference) must not outlive the ArenaMessage. Not copyable or movable.
//
// Thread safety: as the message; one thread at a time.

#include <google/protobuf/arena.h>

#include <cstddef>

namespace kvpool::transport {

template <typename M>
class ArenaMessage {
 public:
  ArenaMessage()
      : arena_(Options(start_)), message_(google::protobuf::Arena::CreateMessage<M>(&arena_)) {}
  ArenaMessage(const ArenaMessage&) = delete;
  ArenaMessage& operator=(const ArenaMessage&) = delete;

  M& operator*() { return *message_; }
  M* operator->() { return message_; }
  M* get() { return message_; }

 private:
  static google::protobuf::ArenaOptions Options(char* start) {
    google::protobuf::ArenaOptions o;
    o.initial_block = start;
    o.initial_block_size = kStartBytes;
    return o;
  }

  static constexpr size_t kStartBytes = 8192;
  alignas(16) char start_[kStartBytes];  // before arena_, which starts in it
  google::protobuf::Arena arena_;
  M* const message_;
};

}  // namespace kvpool::transport
