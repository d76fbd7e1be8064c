#include "client/segment_mappings.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>

#include "client/control_connection.h"
#include "kernels/pinned_memory.h"

namespace kvpool::client {

SegmentMappings::~SegmentMappings() { UnmapAll(); }

void SegmentMappings::Reset(uint64_t segment_bytes) {
  UnmapAll();
  segment_bytes_ = segment_bytes;
}

void SegmentMappings::UnmapAll() {
  read_maps_.clear();
  write_maps_.clear();
}

SegmentMappings::Region::~Region() {
  if (pinned) kernels::UnregisterHostMemory(base, pinned_on);
  munmap(base, bytes);
}

const uint8_t* SegmentMappings::ReadBase(uint32_t segment) const {
  auto it = read_maps_.find(segment);
  return it == read_maps_.end() ? nullptr : it->second.region->base;
}

uint8_t* SegmentMappings::WriteBase(uint32_t segment) const {
  auto it = write_maps_.find(segment);
  return it == write_maps_.end() ? nullptr : it->second.region->base;
}

void SegmentMappings::PinForCopies(uint32_t segment, bool writable, int device) {
  const Map& maps = writable ? write_maps_ : read_maps_;
  auto it = maps.find(segment);
  if (it == maps.end()) return;
  Region& r = *it->second.region;
  if (r.pin_tried) return;
  r.pin_tried = true;
  r.pinned = kernels::CudaDeviceAvailable() &&
             kernels::RegisterHostMemory(r.base, r.bytes, /*read_only=*/!r.writable, device).ok();
  r.pinned_on = device;
}

std::shared_ptr<const void> SegmentMappings::HoldRead(uint32_t segment) const {
  auto it = read_maps_.find(segment);
  if (it == read_maps_.end()) return nullptr;
  return it->second.region;
}

Status SegmentMappings::MapDescriptor(int fd, const SegmentId& seg, bool writable, Map& maps) {
  // MAP_POPULATE: fault the segment in once here, not one page at a time in the copies.
  void* p = mmap(nullptr, segment_bytes_, writable ? PROT_READ | PROT_WRITE : PROT_READ,
                 MAP_SHARED | MAP_POPULATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return Status::FromErrno(errno, "mapping a host segment");
  auto region = std::make_shared<Region>(static_cast<uint8_t*>(p), segment_bytes_, writable);
  maps[seg.first] = Mapping{seg.second, region};
  // Pinned for CUDA now where this thread uses CUDA already (an engine's: its own copies and
  // kernels then reach lent blocks at full speed), else by the first copy to or from a GPU.
  if (kernels::CudaContextCurrent()) PinForCopies(seg.first, writable, /*device=*/-1);
  return Status::OK();
}

Result<std::vector<Status>> SegmentMappings::EnsureMapped(const std::vector<SegmentId>& segs,
                                                          bool writable,
                                                          SegmentDescriptorSource& source,
                                                          transport::Deadline deadline) {
  Map& maps = writable ? write_maps_ : read_maps_;
  std::vector<Status> out(segs.size());
  std::vector<size_t> missing;
  for (size_t i = 0; i < segs.size(); ++i) {
    auto it = maps.find(segs[i].first);
    if (it != maps.end() && it->second.generation == segs[i].second) continue;
    if (it != maps.end()) maps.erase(it);
    bool dup = false;
    for (size_t j : missing) dup |= segs[j] == segs[i];
    if (!dup) missing.push_back(i);
  }
  for (size_t start = 0; start < missing.size(); start += 64) {
    const size_t end = std::min(missing.size(), start + 64);
    wire::MapSegmentsRequest req;
    for (size_t k = start; k < end; ++k) {
      wire::SegmentRequest* r = req.add_segments();
      r->set_segment(segs[missing[k]].first);
      r->set_generation(segs[missing[k]].second);
      r->set_writable(writable);
    }
    wire::MapSegmentsResponse resp;
    std::vector<int> fds;
    KVPOOL_RETURN_IF_ERROR(source.MapSegments(req, &resp, &fds, deadline));
    // (The daemon sends no descriptor with a refusal of the whole request.)
    KVPOOL_RETURN_IF_ERROR(FromWire(resp.status()));
    size_t next_fd = 0;
    for (size_t k = start; k < end; ++k) {
      const size_t i = missing[k];
      Status st = resp.results_size() > static_cast<int>(k - start)
                      ? FromWire(resp.results(static_cast<int>(k - start)))
                      : Status::Internal("MAP_SEGMENTS answered too few results");
      if (st.ok()) {
        if (next_fd >= fds.size()) {
          st = Status::Internal("MAP_SEGMENTS answered without the descriptor");
        } else {
          st = MapDescriptor(fds[next_fd++], segs[i], writable, maps);
        }
      }
      out[i] = st;
    }
    for (size_t f = next_fd; f < fds.size(); ++f) ::close(fds[f]);
  }
  for (size_t i = 0; i < segs.size(); ++i) {
    auto it = maps.find(segs[i].first);
    if (out[i].ok() && (it == maps.end() || it->second.generation != segs[i].second)) {
      out[i] = Status::NotFound("host segment " + std::to_string(segs[i].first) + " not mapped");
    }
  }
  return out;
}

}  // namespace kvpool::client
