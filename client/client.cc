#include <kvpool/client.h>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <unordered_map>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

#include "common/checksum.h"
#include "common/hello_auth.h"
#include "control.pb.h"
#include "kernels/pinned_memory.h"
#include "transport/address.h"
#include "transport/control_channel.h"
#include "transport/frame.h"
#include "transport/ucx_engine.h"

namespace kvpool {

using transport::ControlChannel;
using transport::Deadline;
using transport::FrameHeader;

const char* TierName(Tier tier) {
  switch (tier) {
    case Tier::kNone:
      return "none";
    case Tier::kGpu:
      return "gpu";
    case Tier::kHost:
      return "host";
    case Tier::kDisk:
      return "disk";
    case Tier::kRemote:
      return "remote";
  }
  return "unknown";
}

bool PutResult::all_ok() const {
  return std::all_of(errors.begin(), errors.end(), [](const Status& s) { return s.ok(); });
}

namespace {

Status FromWire(const wire::Status& s) {
  if (s.code() == 0) return Status::OK();
  return Status(static_cast<StatusCode>(s.code()), s.message());
}

Tier FromWire(int t) {
  switch (t) {
    case wire::TIER_GPU:
      return Tier::kGpu;
    case wire::TIER_HOST:
      return Tier::kHost;
    case wire::TIER_DISK:
      return Tier::kDisk;
    case wire::TIER_REMOTE:
      return Tier::kRemote;
    default:
      return Tier::kNone;
  }
}

std::string KeyBytes(const BlockKey& k) { return std::string(k.AsStringView()); }

// Keys back to back, 32 bytes each (the packed_keys wire fields).
void PackKeys(std::span<const BlockKey> keys, std::string* out) {
  out->resize(keys.size() * BlockKey::kSize);
  for (size_t i = 0; i < keys.size(); ++i) {
    std::memcpy(out->data() + i * BlockKey::kSize, keys[i].bytes.data(), BlockKey::kSize);
  }
}

}  // namespace

class Client::Impl {
 public:
  explicit Impl(ClientOptions options) : options_(std::move(options)) {
    if (options_.address.empty()) options_.address = transport::DefaultSocketPath();
    // Responses are bounded by what we ask for; accept any frame the protocol can express.
    recv_limits_.max_body_bytes = 1u << 30;
    recv_limits_.max_payload_bytes = UINT32_MAX;
  }

  Deadline NewDeadline() const { return std::chrono::steady_clock::now() + options_.timeout; }

  Status Connect() {
    channel_.reset();
    UnmapAll();  // segment numbers and generations belong to the daemon instance we talked to
    const std::chrono::milliseconds connect_timeout =
        options_.connect_timeout.count() > 0 ? options_.connect_timeout : options_.timeout;
    KVPOOL_ASSIGN_OR_RETURN(channel_, ControlChannel::Connect(options_.address, connect_timeout));
    wire::HelloRequest req;
    req.set_protocol_version(transport::kProtocolVersion);
    req.set_namespace_name(options_.namespace_name);
    req.set_client_name(options_.client_name);
    const bool tcp = options_.address.rfind("tcp://", 0) == 0;
    req.set_shared_memory(!tcp && (options_.data_path == DataPath::kAuto ||
                                   options_.data_path == DataPath::kSharedMemory));
    const bool want_ucx =
        options_.data_path == DataPath::kUcx || (options_.data_path == DataPath::kAuto && tcp);
    if (want_ucx && ucx_ == nullptr) {
      transport::UcxOptions uo;
      uo.transports = options_.ucx_transports;
      uo.net_devices = options_.ucx_net_devices;
      Result<std::unique_ptr<transport::UcxEngine>> engine = transport::UcxEngine::Create(uo);
      if (engine.ok()) {
        ucx_ = std::move(*engine);
      } else if (options_.data_path == DataPath::kUcx) {
        channel_.reset();
        return engine.status().WithContext("starting UCX");
      }
    }
    if (want_ucx && ucx_ != nullptr) req.set_ucx_worker_address(ucx_->WorkerAddress());
    wire::HelloResponse resp;
    const auto hello_deadline = std::chrono::steady_clock::now() + connect_timeout;
    Status st = ExchangeOnce(wire::HELLO, req, {}, &resp, hello_deadline);
    if (st.ok() && !resp.challenge().empty() && resp.status().code() != 0) {
      // The daemon (cluster mode, TCP) wants proof of the cluster secret.
      if (options_.cluster_secret.empty()) {
        channel_.reset();
        return Status::PermissionDenied("kvpoold at " + options_.address +
                                        " requires the cluster secret "
                                        "(ClientOptions::cluster_secret)");
      }
      req.set_auth(HelloProof(options_.cluster_secret, resp.challenge(), options_.namespace_name));
      resp.Clear();
      st = ExchangeOnce(wire::HELLO, req, {}, &resp, hello_deadline);
    }
    if (!st.ok()) {
      channel_.reset();
      return st;
    }
    st = FromWire(resp.status());
    if (!st.ok()) {
      channel_.reset();
      return st.WithContext("kvpoold refused the connection");
    }
    server_.node_id = resp.node_id();
    server_.daemon_version = resp.daemon_version();
    server_.max_block_bytes = resp.max_block_bytes();
    server_.max_payload_bytes = resp.max_payload_bytes();
    server_.max_batch_keys = std::max<uint32_t>(1, resp.max_batch_keys());
    server_.shared_memory = resp.shared_memory();
    segment_bytes_ = resp.segment_bytes();
    if (ucx_ep_ != 0) {
      ucx_->Disconnect(ucx_ep_);
      ucx_ep_ = 0;
    }
    server_.ucx = false;
    if (resp.ucx() && ucx_ != nullptr) {
      Result<transport::UcxEndpointId> ep = ucx_->Connect(resp.ucx_worker_address());
      if (ep.ok()) {
        ucx_ep_ = *ep;
        ucx_tag_prefix_ = resp.ucx_tag_prefix();
        server_.ucx = true;
      }
    }
    if (options_.data_path == DataPath::kUcx && !server_.ucx) {
      channel_.reset();
      return Status::FailedPrecondition("kvpoold did not grant the UCX data path");
    }
    if (options_.data_path == DataPath::kSharedMemory && !server_.shared_memory) {
      channel_.reset();
      return Status::FailedPrecondition(
          "kvpoold did not grant the shared-memory data path (not a local Unix socket, or "
          "--shared_memory=false)");
    }
    fresh_ = true;
    return Status::OK();
  }

  ~Impl() {
    UnmapAll();
    if (ucx_ep_ != 0) ucx_->Disconnect(ucx_ep_);
  }

  // Waits for a set of asynchronous UCX operations.
  struct UcxBatch {
    absl::Mutex mu;
    size_t left ABSL_GUARDED_BY(mu) = 0;
    std::vector<Status> status ABSL_GUARDED_BY(mu);
    std::vector<size_t> received ABSL_GUARDED_BY(mu);
  };

  // Waits until every operation of `batch` ended; past `deadline` cancels the rest (UCX lets go
  // of their buffers before their callbacks run) and waits for those callbacks.
  void WaitUcx(UcxBatch& batch, const std::vector<transport::UcxOpId>& ops, Deadline deadline) {
    absl::MutexLock lock(&batch.mu);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(batch.mu) { return batch.left == 0; };
    if (!batch.mu.AwaitWithDeadline(
            absl::Condition(&done),
            absl::FromChrono(std::chrono::system_clock::now() +
                             (deadline - std::chrono::steady_clock::now())))) {
      batch.mu.Unlock();
      for (transport::UcxOpId op : ops) {
        if (op != 0) ucx_->Cancel(op);
      }
      batch.mu.Lock();
      batch.mu.Await(absl::Condition(&done));
    }
  }

  void UnmapAll() {
    for (auto* maps : {&read_maps_, &write_maps_}) {
      for (auto& [seg, m] : *maps) Unmap(m);
      maps->clear();
    }
  }

  struct Mapping {
    uint32_t generation = 0;
    uint8_t* base = nullptr;
    bool pinned = false;  // registered with CUDA
  };

  void Unmap(const Mapping& m) {
    if (m.pinned) kernels::UnregisterHostMemory(m.base);
    munmap(m.base, segment_bytes_);
  }

  // Maps the given (segment, generation) pairs, read-only or writable, asking the daemon for
  // their descriptors. A cached mapping of an older generation is dropped. Returns the status of
  // each pair in order.
  Result<std::vector<Status>> EnsureMapped(const std::vector<std::pair<uint32_t, uint32_t>>& segs,
                                           bool writable, Deadline deadline) {
    auto& maps = writable ? write_maps_ : read_maps_;
    std::vector<Status> out(segs.size());
    std::vector<size_t> missing;
    for (size_t i = 0; i < segs.size(); ++i) {
      auto it = maps.find(segs[i].first);
      if (it != maps.end() && it->second.generation == segs[i].second) continue;
      if (it != maps.end()) {
        Unmap(it->second);
        maps.erase(it);
      }
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
      KVPOOL_RETURN_IF_ERROR(ExchangeOnce(wire::MAP_SEGMENTS, req, {}, &resp, deadline));
      std::vector<int> fds = channel_->TakeReceivedFds();
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
            const int fd = fds[next_fd++];
            // MAP_POPULATE: fault the segment in once here, not one page at a time in the copies.
            void* p = mmap(nullptr, segment_bytes_, writable ? PROT_READ | PROT_WRITE : PROT_READ,
                           MAP_SHARED | MAP_POPULATE, fd, 0);
            ::close(fd);
            if (p == MAP_FAILED) {
              st = Status::FromErrno(errno, "mapping a host segment");
            } else {
              // Pinned for CUDA where a GPU is usable: a block then goes from the mapping to
              // GPU memory with one cudaMemcpyAsync.
              const bool pinned =
                  kernels::CudaDeviceAvailable() &&
                  kernels::RegisterHostMemory(p, segment_bytes_, /*read_only=*/!writable).ok();
              maps[segs[i].first] = Mapping{segs[i].second, static_cast<uint8_t*>(p), pinned};
            }
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

  // Sends a request the daemon does not answer (RELEASE).
  template <typename Req>
  Status SendOnly(uint16_t type, const Req& req, Deadline deadline) {
    return SendRequest(type, req, {}, deadline).status();
  }

  // Runs `call` on a live connection. A connection that was already open before this call
  // may have died idle (a daemon restart): on Unavailable, reconnect once and retry. Every
  // kvpool request is idempotent (puts are put-if-absent), so the retry is safe.
  template <typename F>
  auto Run(F call) -> decltype(call()) {
    if (channel_ == nullptr || channel_->broken()) {
      if (!options_.auto_reconnect && channel_ != nullptr) {
        return Status::Unavailable("connection to kvpoold is closed; call Reconnect()");
      }
      KVPOOL_RETURN_IF_ERROR(Connect());
    }
    const bool reused = !fresh_;
    fresh_ = false;
    auto result = call();
    if (!result.ok() && result.status().code() == StatusCode::kUnavailable && reused &&
        options_.auto_reconnect && (channel_ == nullptr || channel_->broken())) {
      KVPOOL_RETURN_IF_ERROR(Connect());
      fresh_ = false;
      result = call();
    }
    return result;
  }

  // Sends one request and receives the response header and body. For a response with a
  // payload, returns its header so the caller reads the payload; `payload_left` is set.
  template <typename Req, typename Resp>
  Status ExchangeOnce(uint16_t type, const Req& req, std::span<const iovec> payload, Resp* resp,
                      Deadline deadline, FrameHeader* out_header = nullptr) {
    KVPOOL_ASSIGN_OR_RETURN(uint64_t id, SendRequest(type, req, payload, deadline));
    return ReceiveResponse(type, id, resp, deadline, out_header);
  }

  // Sends one request frame (the payload gathered from `payload`); returns its request id.
  template <typename Req>
  Result<uint64_t> SendRequest(uint16_t type, const Req& req, std::span<const iovec> payload,
                               Deadline deadline) {
    std::string body;
    if (!req.SerializeToString(&body)) return Status::Internal("cannot serialize request");
    FrameHeader h;
    h.type = type;
    h.request_id = next_request_id_++;
    h.body_bytes = static_cast<uint32_t>(body.size());
    uint64_t payload_bytes = 0;
    for (const iovec& v : payload) payload_bytes += v.iov_len;
    if (payload_bytes > UINT32_MAX) return Status::InvalidArgument("payload too large for a frame");
    h.payload_bytes = static_cast<uint32_t>(payload_bytes);
    KVPOOL_RETURN_IF_ERROR(channel_->Send(h, body, payload, deadline));
    return h.request_id;
  }

  // Receives the response to request `id` and parses its body. With `out_header` the caller
  // reads the response's payload; otherwise it is discarded.
  template <typename Resp>
  Status ReceiveResponse(uint16_t type, uint64_t id, Resp* resp, Deadline deadline,
                         FrameHeader* out_header = nullptr) {
    KVPOOL_ASSIGN_OR_RETURN(FrameHeader rh, channel_->ReceiveHeader(recv_limits_, deadline));
    if (rh.type != type || rh.request_id != id) {
      channel_.reset();
      return Status::Internal("kvpoold answered another request (type " + std::to_string(rh.type) +
                              ", id " + std::to_string(rh.request_id) + ")");
    }
    std::string rbody(rh.body_bytes, '\0');
    KVPOOL_RETURN_IF_ERROR(channel_->ReceiveInto(rbody.data(), rbody.size(), deadline));
    if (!resp->ParseFromString(rbody)) {
      channel_.reset();
      return Status::Internal("malformed response body from kvpoold");
    }
    if (out_header != nullptr) {
      *out_header = rh;
    } else if (rh.payload_bytes > 0) {
      KVPOOL_RETURN_IF_ERROR(channel_->Discard(rh.payload_bytes, deadline));
    }
    return Status::OK();
  }

  // A request without payloads whose response's status decides the result.
  template <typename Req, typename Resp>
  Status Simple(uint16_t type, const Req& req, Resp* resp) {
    KVPOOL_RETURN_IF_ERROR(ExchangeOnce(type, req, {}, resp, NewDeadline()));
    return FromWire(resp->status());
  }

  // Where block i (of `size` bytes) goes: the caller's buffer, or one allocated on the spot.
  using BufferFor = std::function<MutableBuffer(size_t index, uint64_t size)>;

  struct InPlace {
    size_t index;
    uint32_t segment;
    uint32_t generation;
    uint64_t offset;
    uint64_t size;
    uint64_t checksum;
    uint64_t lease_id;
    Tier tier;
  };

  // Copies leased blocks from the shared segments into the caller's buffers, verifying each
  // one's checksum on the way, then releases the leases (no round trip).
  Status CopyInPlace(std::span<const BlockKey> keys, const BufferFor& buffer_for,
                     const std::vector<InPlace>& blocks, std::vector<GetResult>& out,
                     Deadline deadline) {
    std::vector<std::pair<uint32_t, uint32_t>> segs;
    for (const InPlace& b : blocks) segs.emplace_back(b.segment, b.generation);
    Result<std::vector<Status>> mapped = EnsureMapped(segs, /*writable=*/false, deadline);
    wire::ReleaseRequest release;
    for (const InPlace& b : blocks) release.add_lease_ids(b.lease_id);
    if (!mapped.ok()) {
      if (!channel_->broken()) SendOnly(wire::RELEASE, release, deadline).IgnoreError();
      return mapped.status();
    }
    for (size_t k = 0; k < blocks.size(); ++k) {
      const InPlace& b = blocks[k];
      GetResult& r = out[b.index];
      const MutableBuffer buf = buffer_for(b.index, b.size);
      if (!(*mapped)[k].ok()) {
        r.status = (*mapped)[k];
      } else if (b.offset + b.size > segment_bytes_) {
        r.status = Status::Internal("block slot outside its segment");
      } else if (buf.data == nullptr || buf.capacity < b.size) {
        r.status = Status::InvalidArgument("buffer of " + std::to_string(buf.capacity) +
                                           " bytes is too small for the " + std::to_string(b.size) +
                                           "-byte block");
        r.size = b.size;
      } else {
        const uint8_t* src = read_maps_[b.segment].base + b.offset;
        if (CopyWithChecksum(buf.data, src, b.size) != b.checksum) {
          r.status = Status::Corruption("block " + keys[b.index].ShortHex() +
                                        " changed while being read (lease expired?)");
        } else {
          r.status = Status::OK();
          r.size = b.size;
          r.tier = b.tier;
        }
      }
    }
    return SendOnly(wire::RELEASE, release, deadline);
  }

  // Counts a PUT_COMMIT's per-block results into `result`; blocks[j] is the caller's index of
  // the j-th committed block.
  static Status TallyCommit(const wire::PutCommitResponse& resp, const std::vector<size_t>& blocks,
                            PutResult& result) {
    KVPOOL_RETURN_IF_ERROR(FromWire(resp.status()));
    if (resp.results_size() != static_cast<int>(blocks.size())) {
      return Status::Internal("kvpoold answered a PUT_COMMIT with the wrong count");
    }
    for (size_t j = 0; j < blocks.size(); ++j) {
      Status st = FromWire(resp.results(static_cast<int>(j)));
      if (st.ok()) {
        ++result.stored;
      } else {
        result.errors[blocks[j]] = st;
      }
    }
    return Status::OK();
  }

  struct OverUcx {
    size_t index;     // in the caller's keys
    size_t position;  // in the request (the tag offset)
    uint64_t size;
    uint64_t checksum;
    Tier tier;
  };

  // Receives blocks the daemon sends as tagged UCX messages straight into the caller's buffers
  // (or a scratch buffer when one is too small, so the message is drained) and verifies each.
  void ReceiveOverUcx(std::span<const BlockKey> keys, const BufferFor& buffer_for,
                      uint64_t tag_base, const std::vector<OverUcx>& blocks,
                      std::vector<GetResult>& out, Deadline deadline) {
    UcxBatch batch;
    std::vector<std::unique_ptr<uint8_t[]>> scratch(blocks.size());
    std::vector<transport::UcxOpId> ops(blocks.size(), 0);
    std::vector<MutableBuffer> targets(blocks.size());
    {
      absl::MutexLock lock(&batch.mu);
      batch.left = blocks.size();
      batch.status.assign(blocks.size(), Status::OK());
      batch.received.assign(blocks.size(), 0);
    }
    for (size_t k = 0; k < blocks.size(); ++k) {
      targets[k] = buffer_for(blocks[k].index, blocks[k].size);
      const MutableBuffer& buf = targets[k];
      void* dst = buf.data;
      if (dst == nullptr || buf.capacity < blocks[k].size) {
        scratch[k].reset(new uint8_t[std::max<uint64_t>(1, blocks[k].size)]);
        dst = scratch[k].get();
      }
      ops[k] = ucx_->ReceiveTagged(tag_base + blocks[k].position, dst, blocks[k].size,
                                   [&batch, k](Status st, size_t n) {
                                     absl::MutexLock lock(&batch.mu);
                                     batch.status[k] = st;
                                     batch.received[k] = n;
                                     --batch.left;
                                   });
    }
    WaitUcx(batch, ops, deadline);
    absl::MutexLock lock(&batch.mu);
    for (size_t k = 0; k < blocks.size(); ++k) {
      const OverUcx& b = blocks[k];
      GetResult& r = out[b.index];
      if (!batch.status[k].ok()) {
        r.status = batch.status[k].WithContext("UCX transfer of block " + keys[b.index].ShortHex());
      } else if (scratch[k] != nullptr) {
        r.status = Status::InvalidArgument("buffer of " + std::to_string(targets[k].capacity) +
                                           " bytes is too small for the " + std::to_string(b.size) +
                                           "-byte block");
        r.size = b.size;
      } else if (batch.received[k] != b.size ||
                 BlockChecksum(targets[k].data, b.size) != b.checksum) {
        r.status = Status::Corruption("block " + keys[b.index].ShortHex() +
                                      " failed its checksum in transfer");
      } else {
        r.status = Status::OK();
        r.size = b.size;
        r.tier = b.tier;
      }
    }
  }

  // Sends reserved blocks as tagged UCX messages and commits them in one PUT_COMMIT.
  Status CommitOverUcx(std::span<const PutBlock> blocks,
                       const std::vector<std::pair<size_t, uint64_t>>& reserved,
                       PutResult& result) {
    const Deadline deadline = NewDeadline();
    const uint64_t tag_base = ucx_tag_prefix_ | ((++ucx_seq_ & 0xFFFFFF) << 16);
    wire::PutCommitRequest commit;
    commit.set_via_ucx(true);
    commit.set_ucx_tag_base(tag_base);
    for (const auto& [index, rid] : reserved) {
      commit.add_reservation_ids(rid);
      commit.add_sizes(blocks[index].size);
    }
    KVPOOL_ASSIGN_OR_RETURN(uint64_t request_id,
                            SendRequest(wire::PUT_COMMIT, commit, {}, deadline));
    UcxBatch batch;
    std::vector<transport::UcxOpId> ops(reserved.size(), 0);
    {
      absl::MutexLock lock(&batch.mu);
      batch.left = reserved.size();
      batch.status.assign(reserved.size(), Status::OK());
    }
    for (size_t k = 0; k < reserved.size(); ++k) {
      const PutBlock& b = blocks[reserved[k].first];
      ops[k] = ucx_->SendTagged(ucx_ep_, tag_base + k, b.data, b.size, [&batch, k](Status st) {
        absl::MutexLock lock(&batch.mu);
        batch.status[k] = st;
        --batch.left;
      });
    }
    WaitUcx(batch, ops, deadline);
    // The daemon answers once its receives ended (a failed send fails that block there too).
    wire::PutCommitResponse cresp;
    KVPOOL_RETURN_IF_ERROR(ReceiveResponse(wire::PUT_COMMIT, request_id, &cresp, deadline));
    std::vector<size_t> indices;
    for (const auto& [index, rid] : reserved) indices.push_back(index);
    return TallyCommit(cresp, indices, result);
  }

  Result<std::vector<GetResult>> Get(std::span<const BlockKey> keys, const BufferFor& buffer_for) {
    std::vector<GetResult> out(keys.size());
    std::vector<size_t> todo(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) todo[i] = i;
    while (!todo.empty()) {
      std::vector<size_t> deferred;
      for (size_t start = 0; start < todo.size(); start += server_.max_batch_keys) {
        const size_t end = std::min(todo.size(), start + server_.max_batch_keys);
        wire::GetRequest req;
        std::string* packed = req.mutable_packed_keys();
        packed->reserve((end - start) * BlockKey::kSize);
        for (size_t j = start; j < end; ++j) packed->append(keys[todo[j]].AsStringView());
        req.set_in_place(server_.shared_memory);
        const bool via_ucx = server_.ucx && !server_.shared_memory;
        const uint64_t tag_base = (++ucx_seq_ & 0xFFFFFF) << 16;
        if (via_ucx) {
          req.set_via_ucx(true);
          req.set_ucx_tag_base(tag_base);
        }
        wire::GetResponse resp;
        FrameHeader rh;
        const Deadline deadline = NewDeadline();
        KVPOOL_RETURN_IF_ERROR(ExchangeOnce(wire::GET, req, {}, &resp, deadline, &rh));
        Status st = FromWire(resp.status());
        if (!st.ok()) {
          KVPOOL_RETURN_IF_ERROR(channel_->Discard(rh.payload_bytes, deadline));
          return st;
        }
        if (resp.blocks_size() != static_cast<int>(end - start)) {
          channel_.reset();
          return Status::Internal("kvpoold answered a GET with the wrong number of blocks");
        }
        uint64_t consumed = 0;
        std::vector<InPlace> in_place;
        std::vector<OverUcx> over_ucx;
        for (size_t j = start; j < end; ++j) {
          const size_t i = todo[j];
          const wire::BlockInfo& info = resp.blocks(static_cast<int>(j - start));
          GetResult& r = out[i];
          if (info.code() == static_cast<int>(StatusCode::kResourceExhausted) && info.size() == 0) {
            deferred.push_back(i);  // did not fit in this response frame
            continue;
          }
          if (info.code() != 0) {
            r.status = info.code() == static_cast<int>(StatusCode::kNotFound)
                           ? Status::NotFound("not cached")
                           : Status(static_cast<StatusCode>(info.code()), "daemon error");
            continue;
          }
          const uint64_t size = info.size();
          if (info.lease_id() != 0) {
            in_place.push_back({i, info.slot().segment(), info.slot().generation(),
                                info.slot().offset(), size, info.checksum(), info.lease_id(),
                                FromWire(info.tier())});
            continue;
          }
          if (via_ucx) {
            over_ucx.push_back({i, j - start, size, info.checksum(), FromWire(info.tier())});
            continue;
          }
          consumed += size;
          if (consumed > rh.payload_bytes) {
            channel_.reset();
            return Status::Internal("GET response payload shorter than its block list");
          }
          const MutableBuffer buf = buffer_for(i, size);
          if (buf.data == nullptr || buf.capacity < size) {
            KVPOOL_RETURN_IF_ERROR(channel_->Discard(size, deadline));
            r.status = Status::InvalidArgument("buffer of " + std::to_string(buf.capacity) +
                                               " bytes is too small for the " +
                                               std::to_string(size) + "-byte block");
            r.size = size;
            continue;
          }
          KVPOOL_RETURN_IF_ERROR(channel_->ReceiveInto(buf.data, size, deadline));
          if (BlockChecksum(buf.data, size) != info.checksum()) {
            r.status = Status::Corruption("block " + keys[i].ShortHex() +
                                          " failed its checksum in transfer");
            continue;
          }
          r.status = Status::OK();
          r.size = size;
          r.tier = FromWire(info.tier());
        }
        if (consumed != rh.payload_bytes) {
          channel_.reset();
          return Status::Internal("GET response payload longer than its block list");
        }
        if (!in_place.empty())
          KVPOOL_RETURN_IF_ERROR(CopyInPlace(keys, buffer_for, in_place, out, deadline));
        if (!over_ucx.empty()) ReceiveOverUcx(keys, buffer_for, tag_base, over_ucx, out, deadline);
      }
      if (deferred.size() == todo.size()) {
        return Status::Internal("kvpoold deferred every block of a GET");
      }
      todo = std::move(deferred);
    }
    return out;
  }

  Result<PutResult> Put(std::span<const PutBlock> blocks) {
    PutResult result;
    result.errors.assign(blocks.size(), Status::OK());
    std::vector<uint64_t> checksums(blocks.size());
    for (size_t i = 0; i < blocks.size(); ++i) {
      if (blocks[i].size == 0 || blocks[i].data == nullptr) {
        result.errors[i] = Status::InvalidArgument("block " + std::to_string(i) + " is empty");
      } else if (blocks[i].size > server_.max_block_bytes) {
        result.errors[i] = Status::InvalidArgument(
            "block " + std::to_string(i) + " of " + std::to_string(blocks[i].size) +
            " bytes exceeds the daemon's limit of " + std::to_string(server_.max_block_bytes));
      } else if (!server_.shared_memory) {
        // In place, the block is hashed while it is copied into its slot instead.
        checksums[i] = BlockChecksum(blocks[i].data, blocks[i].size);
      }
    }
    // Rounds of at most max_batch_keys blocks and max_payload_bytes bytes: what one round
    // reserves in the daemon's host tier is bounded, and fits one commit frame.
    size_t end = 0;
    for (size_t start = 0; start < blocks.size(); start = end) {
      uint64_t round_bytes = 0;
      end = start;
      while (end < blocks.size() && end - start < server_.max_batch_keys &&
             (end == start || round_bytes + blocks[end].size <= server_.max_payload_bytes)) {
        if (result.errors[end].ok()) round_bytes += blocks[end].size;
        ++end;
      }
      wire::PutReserveRequest req;
      std::vector<size_t> asked;
      for (size_t i = start; i < end; ++i) {
        if (!result.errors[i].ok()) continue;
        wire::PutItem* item = req.add_items();
        item->set_key(KeyBytes(blocks[i].key));
        item->set_size(blocks[i].size);
        item->set_checksum(checksums[i]);
        if (!blocks[i].parent.IsZero()) item->set_parent(KeyBytes(blocks[i].parent));
        asked.push_back(i);
      }
      if (asked.empty()) continue;
      req.set_in_place(server_.shared_memory);
      wire::PutReserveResponse resp;
      KVPOOL_RETURN_IF_ERROR(Simple(wire::PUT_RESERVE, req, &resp));
      if (resp.reservations_size() != static_cast<int>(asked.size())) {
        return Status::Internal("kvpoold answered a PUT_RESERVE with the wrong count");
      }
      std::vector<std::pair<size_t, uint64_t>> reserved;  // block index, reservation id
      std::vector<wire::SegmentSlot> slots;
      for (size_t j = 0; j < asked.size(); ++j) {
        const wire::Reservation& r = resp.reservations(static_cast<int>(j));
        switch (r.state()) {
          case wire::RESERVED:
            reserved.emplace_back(asked[j], r.reservation_id());
            slots.push_back(r.slot());
            break;
          case wire::PRESENT:
            ++result.already_present;
            break;
          case wire::IN_PROGRESS:
            ++result.in_progress;
            break;
          default:
            result.errors[asked[j]] = Status(static_cast<StatusCode>(r.code()), r.message());
        }
      }
      if (server_.shared_memory && !reserved.empty()) {
        KVPOOL_RETURN_IF_ERROR(CommitInPlace(blocks, reserved, slots, result));
        continue;
      }
      if (server_.ucx && !reserved.empty()) {
        KVPOOL_RETURN_IF_ERROR(CommitOverUcx(blocks, reserved, result));
        continue;
      }
      // Commit in frames that fit the daemon's payload limit, straight from caller memory.
      size_t k = 0;
      while (k < reserved.size()) {
        wire::PutCommitRequest commit;
        std::vector<iovec> iov;
        std::vector<size_t> in_frame;
        uint64_t bytes = 0;
        while (k < reserved.size()) {
          const PutBlock& b = blocks[reserved[k].first];
          if (!in_frame.empty() && bytes + b.size > server_.max_payload_bytes) break;
          commit.add_reservation_ids(reserved[k].second);
          commit.add_sizes(b.size);
          iov.push_back({const_cast<void*>(b.data), b.size});
          in_frame.push_back(reserved[k].first);
          bytes += b.size;
          ++k;
        }
        wire::PutCommitResponse cresp;
        KVPOOL_RETURN_IF_ERROR(ExchangeOnce(wire::PUT_COMMIT, commit, iov, &cresp, NewDeadline()));
        KVPOOL_RETURN_IF_ERROR(TallyCommit(cresp, in_frame, result));
      }
    }
    return result;
  }

  // Writes reserved blocks straight into their slots through writable mappings of this
  // namespace's segments, then commits them; the daemon verifies each checksum.
  Status CommitInPlace(std::span<const PutBlock> blocks,
                       const std::vector<std::pair<size_t, uint64_t>>& reserved,
                       const std::vector<wire::SegmentSlot>& slots, PutResult& result) {
    const Deadline deadline = NewDeadline();
    std::vector<std::pair<uint32_t, uint32_t>> segs;
    for (const wire::SegmentSlot& s : slots) segs.emplace_back(s.segment(), s.generation());
    KVPOOL_ASSIGN_OR_RETURN(std::vector<Status> mapped,
                            EnsureMapped(segs, /*writable=*/true, deadline));
    wire::PutCommitRequest commit;
    commit.set_in_place(true);
    wire::PutAbortRequest abort;
    std::vector<size_t> in_frame;
    for (size_t k = 0; k < reserved.size(); ++k) {
      const PutBlock& b = blocks[reserved[k].first];
      if (!mapped[k].ok() || slots[k].offset() + b.size > segment_bytes_) {
        result.errors[reserved[k].first] =
            mapped[k].ok() ? Status::Internal("reserved slot outside its segment") : mapped[k];
        abort.add_reservation_ids(reserved[k].second);
        continue;
      }
      // One pass: copy into the slot and hash what was copied (the daemon verifies it again).
      commit.add_checksums(CopyWithChecksum(
          write_maps_[slots[k].segment()].base + slots[k].offset(), b.data, b.size));
      commit.add_reservation_ids(reserved[k].second);
      commit.add_sizes(b.size);
      in_frame.push_back(reserved[k].first);
    }
    if (abort.reservation_ids_size() > 0) {
      wire::PutAbortResponse aresp;
      KVPOOL_RETURN_IF_ERROR(Simple(wire::PUT_ABORT, abort, &aresp));
    }
    if (in_frame.empty()) return Status::OK();
    wire::PutCommitResponse cresp;
    KVPOOL_RETURN_IF_ERROR(ExchangeOnce(wire::PUT_COMMIT, commit, {}, &cresp, NewDeadline()));
    return TallyCommit(cresp, in_frame, result);
  }

  ClientOptions options_;
  ServerInfo server_;
  uint64_t segment_bytes_ = 0;
  std::unordered_map<uint32_t, Mapping> read_maps_;   // segment -> read-only mapping
  std::unordered_map<uint32_t, Mapping> write_maps_;  // segment -> writable mapping
  std::unique_ptr<transport::UcxEngine> ucx_;         // created at the first hello that wants UCX
  transport::UcxEndpointId ucx_ep_ = 0;
  uint64_t ucx_tag_prefix_ = 0;
  uint64_t ucx_seq_ = 0;
  std::unique_ptr<ControlChannel> channel_;
  transport::FrameLimits recv_limits_;
  uint64_t next_request_id_ = 1;
  bool fresh_ = false;  // connected by the current call
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

Result<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  KVPOOL_RETURN_IF_ERROR(impl->Connect());
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

Status Client::Reconnect() { return impl_->Connect(); }
const ServerInfo& Client::server() const { return impl_->server_; }
const ClientOptions& Client::options() const { return impl_->options_; }

Result<LookupResult> Client::Lookup(std::span<const BlockKey> chain, bool prefetch) {
  return impl_->Run([&]() -> Result<LookupResult> {
    LookupResult out;
    // A chain longer than one request is looked up piecewise; the prefix stops at the first miss.
    for (size_t start = 0; start < chain.size(); start += impl_->server_.max_batch_keys) {
      const size_t end = std::min(chain.size(), start + impl_->server_.max_batch_keys);
      wire::LookupRequest req;
      PackKeys(chain.subspan(start, end - start), req.mutable_packed_keys());
      req.set_no_prefetch(!prefetch);
      wire::LookupResponse resp;
      KVPOOL_RETURN_IF_ERROR(impl_->Simple(wire::LOOKUP, req, &resp));
      out.hit_blocks += resp.hit_blocks();
      for (int t : resp.tiers()) out.tiers.push_back(FromWire(t));
      if (resp.hit_blocks() < end - start) break;
    }
    return out;
  });
}

Result<std::vector<GetResult>> Client::Get(std::span<const BlockKey> keys,
                                           std::span<const MutableBuffer> buffers) {
  if (buffers.size() != keys.size()) {
    return Status::InvalidArgument("Get needs one buffer per key");
  }
  const Impl::BufferFor caller = [&](size_t i, uint64_t) { return buffers[i]; };
  return impl_->Run([&] { return impl_->Get(keys, caller); });
}

Result<std::vector<FetchedBlock>> Client::GetBlocks(std::span<const BlockKey> keys) {
  std::vector<FetchedBlock> out(keys.size());
  const Impl::BufferFor allocate = [&](size_t i, uint64_t size) {
    out[i].bytes.resize(size);
    return MutableBuffer{out[i].bytes.data(), out[i].bytes.size()};
  };
  KVPOOL_ASSIGN_OR_RETURN(std::vector<GetResult> results,
                          impl_->Run([&] { return impl_->Get(keys, allocate); }));
  for (size_t i = 0; i < keys.size(); ++i) {
    out[i].status = results[i].status;
    out[i].tier = results[i].tier;
    if (!out[i].status.ok()) out[i].bytes.clear();
  }
  return out;
}

Result<PutResult> Client::Put(std::span<const PutBlock> blocks) {
  return impl_->Run([&] { return impl_->Put(blocks); });
}

Result<PutResult> Client::PutChain(std::span<const BlockKey> keys,
                                   std::span<const std::span<const uint8_t>> blocks,
                                   const BlockKey& parent) {
  if (keys.size() != blocks.size()) {
    return Status::InvalidArgument("PutChain needs one block per key");
  }
  std::vector<PutBlock> puts(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    puts[i].key = keys[i];
    puts[i].data = blocks[i].data();
    puts[i].size = blocks[i].size();
    puts[i].parent = i == 0 ? parent : keys[i - 1];
  }
  return Put(puts);
}

Result<uint32_t> Client::Prefetch(std::span<const BlockKey> keys) {
  return impl_->Run([&]() -> Result<uint32_t> {
    uint32_t scheduled = 0;
    for (size_t start = 0; start < keys.size(); start += impl_->server_.max_batch_keys) {
      const size_t end = std::min(keys.size(), start + impl_->server_.max_batch_keys);
      wire::PrefetchRequest req;
      for (size_t i = start; i < end; ++i) req.add_keys(KeyBytes(keys[i]));
      wire::PrefetchResponse resp;
      KVPOOL_RETURN_IF_ERROR(impl_->Simple(wire::PREFETCH, req, &resp));
      scheduled += resp.scheduled();
    }
    return scheduled;
  });
}

Status Client::SaveSession(const Session& session) {
  return impl_
      ->Run([&]() -> Result<bool> {
        wire::SessionSaveRequest req;
        wire::SessionRecord* r = req.mutable_record();
        r->set_session_id(session.session_id);
        for (const BlockKey& k : session.keys) r->add_keys(KeyBytes(k));
        r->set_token_count(session.token_count);
        for (const auto& [k, v] : session.metadata) (*r->mutable_metadata())[k] = v;
        wire::SessionSaveResponse resp;
        KVPOOL_RETURN_IF_ERROR(impl_->Simple(wire::SESSION_SAVE, req, &resp));
        return true;
      })
      .status();
}

Result<LoadedSession> Client::LoadSession(const std::string& session_id, bool prefetch) {
  return impl_->Run([&]() -> Result<LoadedSession> {
    wire::SessionLoadRequest req;
    req.set_session_id(session_id);
    req.set_no_prefetch(!prefetch);
    wire::SessionLoadResponse resp;
    KVPOOL_RETURN_IF_ERROR(impl_->Simple(wire::SESSION_LOAD, req, &resp));
    LoadedSession out;
    const wire::SessionRecord& r = resp.record();
    out.session.session_id = r.session_id();
    for (const std::string& k : r.keys()) {
      KVPOOL_ASSIGN_OR_RETURN(BlockKey key, BlockKey::FromBytes(k));
      out.session.keys.push_back(key);
    }
    out.session.token_count = r.token_count();
    for (const auto& [k, v] : r.metadata()) out.session.metadata[k] = v;
    out.session.created_unix_ms = r.created_unix_ms();
    out.session.updated_unix_ms = r.updated_unix_ms();
    out.session.total_bytes = r.total_bytes();
    out.cached_blocks = resp.cached_blocks();
    return out;
  });
}

Status Client::DeleteSession(const std::string& session_id) {
  return impl_
      ->Run([&]() -> Result<bool> {
        wire::SessionDeleteRequest req;
        req.set_session_id(session_id);
        wire::SessionDeleteResponse resp;
        KVPOOL_RETURN_IF_ERROR(impl_->Simple(wire::SESSION_DELETE, req, &resp));
        return true;
      })
      .status();
}

Result<std::vector<SessionSummary>> Client::ListSessions(const std::string& prefix,
                                                         uint32_t limit) {
  return impl_->Run([&]() -> Result<std::vector<SessionSummary>> {
    wire::SessionListRequest req;
    req.set_prefix(prefix);
    req.set_limit(limit);
    wire::SessionListResponse resp;
    KVPOOL_RETURN_IF_ERROR(impl_->Simple(wire::SESSION_LIST, req, &resp));
    std::vector<SessionSummary> out;
    for (const wire::SessionSummary& s : resp.sessions()) {
      out.push_back(
          {s.session_id(), s.blocks(), s.token_count(), s.updated_unix_ms(), s.total_bytes()});
    }
    return out;
  });
}

Result<DaemonStats> Client::Stats() {
  return impl_->Run([&]() -> Result<DaemonStats> {
    wire::StatsRequest req;
    wire::StatsResponse r;
    KVPOOL_RETURN_IF_ERROR(impl_->Simple(wire::STATS, req, &r));
    DaemonStats s;
    s.node_id = r.node_id();
    s.version = r.version();
    s.uptime_s = r.uptime_s();
    for (const wire::TierStats& t : r.tiers()) {
      s.tiers.push_back({t.name(), t.capacity_bytes(), t.used_bytes(), t.blocks(),
                         t.allocated_bytes(), t.fragmentation(), t.hits(), t.promotions(),
                         t.demotions(), t.evictions()});
    }
    s.index_entries = r.index_entries();
    s.index_bytes = r.index_bytes();
    s.sessions = r.sessions();
    s.connections = r.connections();
    s.lookups = r.lookups();
    s.lookup_blocks = r.lookup_blocks();
    s.lookup_hit_blocks = r.lookup_hit_blocks();
    s.gets = r.gets();
    s.get_blocks_served = r.get_blocks_served();
    s.get_misses = r.get_misses();
    s.puts_offered = r.puts_offered();
    s.puts_deduplicated = r.puts_deduplicated();
    s.puts_committed = r.puts_committed();
    s.bytes_in = r.bytes_in();
    s.bytes_out = r.bytes_out();
    s.prefetches_issued = r.prefetches_issued();
    s.prefetches_useful = r.prefetches_useful();
    s.checksum_failures = r.checksum_failures();
    s.leases_active = r.leases_active();
    s.reservations_active = r.reservations_active();
    s.dedup_ratio = r.dedup_ratio();
    s.cluster_state = r.cluster_state();
    s.cluster_members = r.cluster_members();
    s.cluster_reason = r.cluster_reason();
    return s;
  });
}

Result<ClusterView> Client::Cluster() {
  return impl_->Run([&]() -> Result<ClusterView> {
    wire::ClusterMembersRequest req;
    wire::ClusterMembersResponse resp;
    KVPOOL_RETURN_IF_ERROR(
        impl_->ExchangeOnce(wire::CLUSTER_MEMBERS, req, {}, &resp, impl_->NewDeadline()));
    if (resp.status().code() != 0) return FromWire(resp.status());
    ClusterView v;
    v.state = resp.cluster_state();
    v.reason = resp.status().message();
    for (const wire::ClusterMember& m : resp.members()) {
      v.members.push_back({m.node_id(), m.control_address(), m.state(), m.capacity_bytes(),
                           m.used_bytes(), m.self(), m.started_unix_ms()});
    }
    return v;
  });
}

Result<std::vector<NodeLocation>> Client::Locate(std::span<const BlockKey> chain) {
  return impl_->Run([&]() -> Result<std::vector<NodeLocation>> {
    std::vector<NodeLocation> out;
    // A chain longer than one request is located piecewise: a node's prefix grows with a piece
    // only while it held every block before it.
    for (size_t start = 0;; start += impl_->server_.max_batch_keys) {
      const size_t end = std::min(chain.size(), start + impl_->server_.max_batch_keys);
      wire::LocateRequest req;
      PackKeys(chain.subspan(start, end - start), req.mutable_packed_keys());
      wire::LocateResponse resp;
      KVPOOL_RETURN_IF_ERROR(impl_->Simple(wire::LOCATE, req, &resp));
      for (const wire::NodeLocation& n : resp.nodes()) {
        NodeLocation* loc = nullptr;
        for (NodeLocation& o : out) loc = o.node_id == n.node_id() ? &o : loc;
        if (loc == nullptr) {
          if (start != 0) continue;  // joined between two pieces: its first piece is unknown
          out.push_back({n.node_id(), n.control_address(), n.self(), FromWire(n.status()), 0, {}});
          loc = &out.back();
        }
        if (!loc->status.ok() || loc->hit_blocks != start) continue;
        if (n.status().code() != 0) {
          loc->status = FromWire(n.status());
          continue;
        }
        loc->hit_blocks += n.hit_blocks();
        for (int t : n.tiers()) loc->tiers.push_back(FromWire(t));
      }
      if (end >= chain.size()) break;
    }
    return out;
  });
}

Result<EvictResult> Client::Evict(Tier tier, std::span<const BlockKey> keys) {
  return impl_->Run([&]() -> Result<EvictResult> {
    wire::EvictRequest req;
    req.set_tier(tier == Tier::kHost ? wire::TIER_HOST : wire::TIER_DISK);
    for (const BlockKey& k : keys) req.add_keys(KeyBytes(k));
    wire::EvictResponse resp;
    KVPOOL_RETURN_IF_ERROR(impl_->Simple(wire::EVICT, req, &resp));
    return EvictResult{resp.evicted(), resp.skipped()};
  });
}

}  // namespace kvpool
