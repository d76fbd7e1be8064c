#pragma once
// SegmentMappings: the client's mappings of the daemon's host-arena segments, for the
// shared-memory data path. The daemon hands out a segment as a file descriptor (MAP_SEGMENTS,
// SCM_RIGHTS); the client maps it once, read-only for leased reads and writable for its own
// reservations, and keeps the mapping by segment number until the daemon names a newer
// generation of that segment or the connection ends (numbers and generations belong to one
// daemon instance). A mapping is also registered with CUDA where a GPU is usable, so a block
// goes from it to GPU memory with one copy. A read-only mapping can be held past that
// (HoldRead): blocks borrowed in place keep the memory they point into mapped until they are
// dropped, whatever the connection does meanwhile.
//
// Thread safety: none; one thread at a time (as kvpool::Client). Ownership: owns its mappings
// (unmapped by UnmapAll and the destructor) and the descriptors a source hands it with a
// per-segment answer (closed once mapped, or when unused).

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"
#include "control.pb.h"
#include "transport/control_channel.h"

namespace kvpool::client {

// Where SegmentMappings gets segment descriptors: the daemon's MAP_SEGMENTS over the control
// connection (client.cc), or a test's memfds.
class SegmentDescriptorSource {
 public:
  virtual ~SegmentDescriptorSource() = default;
  // One MAP_SEGMENTS round trip. On OK, `resp` holds the answer and `fds` the descriptors that
  // came with it (one per result with code 0, in order; the caller owns them). Non-OK when the
  // round trip itself failed.
  virtual Status MapSegments(const wire::MapSegmentsRequest& req, wire::MapSegmentsResponse* resp,
                             std::vector<int>* fds, transport::Deadline deadline) = 0;
};

class SegmentMappings {
 public:
  // (segment, generation)
  using SegmentId = std::pair<uint32_t, uint32_t>;

  SegmentMappings() = default;
  ~SegmentMappings();
  SegmentMappings(const SegmentMappings&) = delete;
  SegmentMappings& operator=(const SegmentMappings&) = delete;

  // The size of every segment (the daemon's HelloResponse::segment_bytes). Unmaps everything
  // first: a mapping's length is the size it was mapped with.
  void Reset(uint64_t segment_bytes);
  uint64_t segment_bytes() const { return segment_bytes_; }
  // Whether `size` bytes at `offset` lie inside one segment (without overflow for any offset).
  bool Holds(uint64_t offset, uint64_t size) const {
    return size <= segment_bytes_ && offset <= segment_bytes_ - size;
  }

  // Maps the given segments, read-only or writable, asking `source` for the descriptors of
  // those not mapped at that generation (at most 64 a round trip; a cached mapping of another
  // generation is dropped). Returns the status of each pair in order: OK when mapped now; the
  // daemon's refusal of it; the mmap error; NotFound when it is not mapped at that generation
  // after all. Non-OK when a round trip failed, or the daemon refused the whole request.
  Result<std::vector<Status>> EnsureMapped(const std::vector<SegmentId>& segs, bool writable,
                                           SegmentDescriptorSource& source,
                                           transport::Deadline deadline);

  // The start of `segment`'s read-only (or writable) mapping; nullptr when not mapped.
  const uint8_t* ReadBase(uint32_t segment) const;
  uint8_t* WriteBase(uint32_t segment) const;
  // Keeps `segment`'s read-only mapping (as ReadBase names it) mapped for as long as the
  // returned handle lives, even past UnmapAll or a newer generation; null when not mapped.
  std::shared_ptr<const void> HoldRead(uint32_t segment) const;
  // Pins `segment`'s read-only (or writable) mapping for CUDA copies (cudaHostRegister, with
  // CUDA device `device` current, or the thread's own for -1; unregistered the same way), once,
  // before the first copy between it and GPU memory: a copy from pinned memory is one DMA at
  // full speed, from unpinned memory it is staged. Done only then, because registering creates a
  // CUDA context on that device (several hundred MiB of its memory), which a process that never
  // copies to a GPU must not pay. A failure leaves it unpinned (copies still work, staged).
  void PinForCopies(uint32_t segment, bool writable, int device);

  // Drops every mapping (one still held stays mapped until its last holder lets go).
  void UnmapAll();

 private:
  // One mmap of a segment, unmapped (and unregistered from CUDA) when the last holder drops it.
  struct Region {
    Region(uint8_t* base, uint64_t bytes, bool writable)
        : base(base), bytes(bytes), writable(writable) {}
    ~Region();
    Region(const Region&) = delete;
    Region& operator=(const Region&) = delete;
    uint8_t* const base;
    const uint64_t bytes;
    const bool writable;
    bool pin_tried = false;  // PinForCopies ran
    bool pinned = false;     // registered with CUDA
    int pinned_on = -1;      // with this device current (-1: the thread's own)
  };
  struct Mapping {
    uint32_t generation = 0;
    std::shared_ptr<Region> region;
  };
  using Map = std::unordered_map<uint32_t, Mapping>;  // segment -> mapping

  // Maps `fd` (and closes it) as `seg` in `maps`.
  Status MapDescriptor(int fd, const SegmentId& seg, bool writable, Map& maps);

  uint64_t segment_bytes_ = 0;
  Map read_maps_;
  Map write_maps_;
};

}  // namespace kvpool::client
