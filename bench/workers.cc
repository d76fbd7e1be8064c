#include "bench/workers.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "bench/pinning.h"

namespace kvpool::bench {
namespace {

constexpr uint64_t kPage = 4096;
uint64_t PageRounded(uint64_t n) { return (n + kPage - 1) / kPage * kPage; }

}  // namespace

// ---------------------------------------------------------------------------------------------
// PutWorker

PutWorker::PutWorker(BenchSystem& system, int index, const PatternSet& pattern, size_t batch,
                     std::string run_secret, std::string stream, size_t max_blocks)
    : system_(system),
      index_(index),
      pattern_(pattern),
      batch_(batch),
      run_secret_(std::move(run_secret)),
      stream_(std::move(stream)),
      max_blocks_(max_blocks) {}

Status PutWorker::Prepare() {
  KVPOOL_ASSIGN_OR_RETURN(target_, system_.NewTarget(index_));
  keys_ = MakeKeys(run_secret_, stream_, max_blocks_);
  const size_t b = pattern_.block_bytes();
  buffers_ = AlignedBuffer(batch_ * b);
  for (size_t j = 0; j < batch_; ++j) std::memcpy(buffers_.data() + j * b, pattern_.slot(j), b);
  return Status::OK();
}

Status PutWorker::Run(PhaseClock& clock) {
  const size_t b = pattern_.block_bytes();
  std::vector<BenchBlock> blocks(batch_);
  while (stored_ + batch_ <= keys_.size() && clock.Continue()) {
    for (size_t j = 0; j < batch_; ++j) {
      uint8_t* buf = buffers_.data() + j * b;
      StampBlock(keys_[stored_ + j], buf, b);
      blocks[j] = {keys_[stored_ + j], buf, b, {}};
    }
    const Clock::time_point t0 = Clock::now();
    Status st = target_->Put(blocks);
    const Clock::duration d = Clock::now() - t0;
    if (!st.ok()) return st.WithContext("put call " + std::to_string(stored_ / batch_));
    clock.Record(d, batch_ * b);
    stored_ += batch_;
  }
  if (stored_ + batch_ > keys_.size()) clock.OutOfData();
  return Status::OK();
}

std::vector<StoredBlock> PutWorker::Stored() const {
  std::vector<StoredBlock> out(stored_);
  for (size_t i = 0; i < stored_; ++i) {
    out[i] = {keys_[i], static_cast<uint32_t>(i % batch_),
              static_cast<uint32_t>(pattern_.block_bytes())};
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// GetWorker

GetWorker::GetWorker(BenchSystem& system, int index, const PatternSet& pattern, size_t batch,
                     const std::vector<StoredBlock>& blocks, size_t start, uint32_t verify_every)
    : system_(system),
      index_(index),
      pattern_(pattern),
      batch_(batch),
      blocks_(blocks),
      start_(start),
      verify_every_(std::max<uint32_t>(1, verify_every)) {}

Status GetWorker::Prepare() {
  if (blocks_.empty()) return Status::FailedPrecondition("nothing was stored to get");
  KVPOOL_ASSIGN_OR_RETURN(target_, system_.NewTarget(index_));
  buffers_ = AlignedBuffer(batch_ * pattern_.block_bytes());
  return Status::OK();
}

Status GetWorker::Run(PhaseClock& clock) {
  const size_t b = pattern_.block_bytes();
  const size_t n = blocks_.size();
  std::vector<BlockKey> keys(batch_);
  std::vector<MutableBuffer> bufs(batch_);
  std::vector<size_t> sizes(batch_);
  std::vector<size_t> which(batch_);
  for (size_t j = 0; j < batch_; ++j) bufs[j] = {buffers_.data() + j * b, b};
  size_t pos = start_ % n;
  for (uint64_t call = 0; clock.Continue(); ++call) {
    for (size_t j = 0; j < batch_; ++j) {
      which[j] = (pos + j) % n;
      keys[j] = blocks_[which[j]].key;
    }
    std::fill(sizes.begin(), sizes.end(), 0);
    const Clock::time_point t0 = Clock::now();
    Status st = target_->Get(keys, bufs, sizes);
    const Clock::duration d = Clock::now() - t0;
    if (!st.ok()) return st.WithContext("get call " + std::to_string(call));
    uint64_t bytes = 0;
    for (size_t s : sizes) bytes += s;
    clock.Record(d, bytes);
    if (call % verify_every_ == 0) {
      for (size_t j = 0; j < batch_; ++j) {
        const StoredBlock& sb = blocks_[which[j]];
        KVPOOL_RETURN_IF_ERROR(VerifyBlock(sb.key, buffers_.data() + j * b, sizes[j],
                                           pattern_.slot(sb.slot), sb.size));
      }
      ++verified_calls_;
      verified_blocks_ += batch_;
    }
    pos = (pos + batch_) % n;
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// BorrowWorker

BorrowWorker::BorrowWorker(BenchSystem& system, int index, const PatternSet& pattern, size_t batch,
                           const std::vector<StoredBlock>& blocks, size_t start,
                           uint32_t verify_every, bool verify)
    : system_(system),
      index_(index),
      pattern_(pattern),
      batch_(batch),
      blocks_(blocks),
      start_(start),
      verify_every_(std::max<uint32_t>(1, verify_every)),
      verify_(verify) {}

Status BorrowWorker::Prepare() {
  if (blocks_.empty()) return Status::FailedPrecondition("nothing was stored to borrow");
  KVPOOL_ASSIGN_OR_RETURN(target_, system_.NewTarget(index_));
  return Status::OK();
}

Status BorrowWorker::Run(PhaseClock& clock) {
  const size_t n = blocks_.size();
  std::vector<BlockKey> keys(batch_);
  std::vector<std::span<const uint8_t>> views(batch_);
  std::vector<size_t> which(batch_);
  size_t pos = start_ % n;
  for (uint64_t call = 0; clock.Continue(); ++call) {
    for (size_t j = 0; j < batch_; ++j) {
      which[j] = (pos + j) % n;
      keys[j] = blocks_[which[j]].key;
    }
    const bool check = call % verify_every_ == 0;
    Clock::time_point t0 = Clock::now();
    Status st = target_->Borrow(keys, verify_, views);
    Clock::duration d = Clock::now() - t0;
    if (!st.ok()) return st.WithContext("borrow call " + std::to_string(call));
    uint64_t bytes = 0;
    for (const auto& v : views) bytes += v.size();
    if (check) {
      for (size_t j = 0; j < batch_; ++j) {
        const StoredBlock& sb = blocks_[which[j]];
        KVPOOL_RETURN_IF_ERROR(
            VerifyBlock(sb.key, views[j].data(), views[j].size(), pattern_.slot(sb.slot), sb.size));
      }
      verified_blocks_ += batch_;
    }
    t0 = Clock::now();
    st = target_->ReleaseBorrowed();
    d += Clock::now() - t0;
    if (!st.ok()) return st.WithContext("release call " + std::to_string(call));
    clock.Record(d, bytes);
    pos = (pos + batch_) % n;
  }
  // The last release must have ended its leases before the bench drops the blocks over its
  // own connection (untimed).
  return target_->Settle().WithContext("settling the last release");
}

// ---------------------------------------------------------------------------------------------
// LookupWorker

LookupWorker::LookupWorker(BenchSystem& system, int index, const std::vector<BlockKey>& chain)
    : system_(system), index_(index), chain_(chain) {}

Status LookupWorker::Prepare() {
  KVPOOL_ASSIGN_OR_RETURN(target_, system_.NewTarget(index_));
  return Status::OK();
}

Status LookupWorker::Run(PhaseClock& clock) {
  for (uint64_t call = 0; clock.Continue(); ++call) {
    const Clock::time_point t0 = Clock::now();
    Result<uint32_t> hits = target_->Lookup(chain_);
    const Clock::duration d = Clock::now() - t0;
    if (!hits.ok()) return hits.status().WithContext("lookup call " + std::to_string(call));
    if (*hits != chain_.size()) {
      return Status::Internal("lookup call " + std::to_string(call) + " found " +
                              std::to_string(*hits) + " of the " + std::to_string(chain_.size()) +
                              " cached blocks of the chain");
    }
    clock.Record(d, 0);
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// MixedPutWorker

MixedPutWorker::MixedPutWorker(BenchSystem& system, const PatternSet& pattern, size_t batch,
                               std::vector<size_t> sizes, uint64_t budget_bytes,
                               std::string run_secret, std::string stream, uint64_t seed)
    : system_(system),
      pattern_(pattern),
      batch_(batch),
      sizes_(std::move(sizes)),
      budget_bytes_(budget_bytes),
      run_secret_(std::move(run_secret)),
      stream_(std::move(stream)),
      rng_(seed) {}

Status MixedPutWorker::Prepare() {
  if (sizes_.empty()) return Status::InvalidArgument("no block sizes for the mixed workload");
  KVPOOL_ASSIGN_OR_RETURN(target_, system_.NewTarget(0));
  const size_t smallest = *std::min_element(sizes_.begin(), sizes_.end());
  keys_ = MakeKeys(run_secret_, stream_, budget_bytes_ / PageRounded(smallest) + batch_);
  const size_t b = pattern_.block_bytes();
  buffers_ = AlignedBuffer(batch_ * b);
  for (size_t j = 0; j < batch_; ++j) std::memcpy(buffers_.data() + j * b, pattern_.slot(j), b);
  return Status::OK();
}

Status MixedPutWorker::Run(PhaseClock& clock) {
  const size_t b = pattern_.block_bytes();
  std::uniform_int_distribution<size_t> pick(0, sizes_.size() - 1);
  std::vector<BenchBlock> blocks;
  uint64_t allocated = 0;
  size_t next = 0;
  while (allocated < budget_bytes_ && next + batch_ <= keys_.size() && clock.Continue()) {
    blocks.clear();
    uint64_t bytes = 0;
    for (size_t j = 0; j < batch_ && allocated < budget_bytes_; ++j) {
      const size_t size = sizes_[pick(rng_)];
      uint8_t* buf = buffers_.data() + j * b;
      StampBlock(keys_[next], buf, size);
      blocks.push_back({keys_[next], buf, size, {}});
      stored_.push_back({keys_[next], static_cast<uint32_t>(j), static_cast<uint32_t>(size)});
      ++next;
      bytes += size;
      allocated += PageRounded(size);
    }
    const Clock::time_point t0 = Clock::now();
    Status st = target_->Put(blocks);
    const Clock::duration d = Clock::now() - t0;
    if (!st.ok())
      return st.WithContext("mixed put of " + std::to_string(blocks.size()) + " blocks");
    clock.Record(d, bytes);
  }
  clock.OutOfData();
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// MemcpyWorker

MemcpyWorker::MemcpyWorker(const AlignedBuffer& ring, size_t block_bytes, size_t batch)
    : ring_(ring), block_bytes_(block_bytes), batch_(batch) {}

Status MemcpyWorker::Prepare() {
  if (ring_.size() < block_bytes_)
    return Status::InvalidArgument("memcpy ring smaller than a block");
  buffers_ = AlignedBuffer(batch_ * block_bytes_);
  return Status::OK();
}

Status MemcpyWorker::Run(PhaseClock& clock) {
  size_t pos = 0;
  while (clock.Continue()) {
    const Clock::time_point t0 = Clock::now();
    for (size_t j = 0; j < batch_; ++j) {
      if (pos + block_bytes_ > ring_.size()) pos = 0;
      std::memcpy(buffers_.data() + j * block_bytes_, ring_.data() + pos, block_bytes_);
      pos += block_bytes_;
    }
    // The copies must happen inside the sample, not be sunk past it or dropped.
    asm volatile("" : : "r"(buffers_.data()) : "memory");
    clock.Record(Clock::now() - t0, batch_ * block_bytes_);
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
// SocketpairWorker

namespace {

// Reads exactly n bytes; false on EOF or error. Non-blocking socket plus poll, as the client's
// channel and kvpoold's Asio loop do.
bool ReadFull(int fd, void* p, size_t n) {
  auto* c = static_cast<uint8_t*>(p);
  while (n > 0) {
    const ssize_t r = read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd pfd{fd, POLLIN, 0};
      poll(&pfd, 1, -1);
      continue;
    }
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool WriteFull(int fd, const void* p, size_t n) {
  auto* c = static_cast<const uint8_t*>(p);
  while (n > 0) {
    const ssize_t r = send(fd, c, n, MSG_NOSIGNAL);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd pfd{fd, POLLOUT, 0};
      poll(&pfd, 1, -1);
      continue;
    }
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

}  // namespace

SocketpairWorker::SocketpairWorker(const AlignedBuffer& ring, size_t block_bytes, size_t batch,
                                   std::vector<int> receiver_cpus)
    : ring_(ring),
      block_bytes_(block_bytes),
      batch_(batch),
      receiver_cpus_(std::move(receiver_cpus)) {}

SocketpairWorker::~SocketpairWorker() { StopReceiver(); }

Status SocketpairWorker::Prepare() {
  if (ring_.size() < block_bytes_) return Status::InvalidArgument("ring smaller than a block");
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, fds_) != 0) {
    return Status::FromErrno(errno, "socketpair");
  }
  receive_buffers_ = AlignedBuffer(batch_ * block_bytes_);
  receiver_ = std::thread([this] { Receive(); });
  return Status::OK();
}

// The serving side (named for the request it receives): answers each 8-byte request with
// `batch` blocks from the ring, in one sendmsg, as kvpoold answers a get.
void SocketpairWorker::Receive() {
  (void)PinThisThread(receiver_cpus_);
  std::vector<iovec> iov(batch_);
  size_t pos = 0;
  uint64_t n = 0;
  while (ReadFull(fds_[1], &n, sizeof(n)) && n > 0) {
    for (size_t j = 0; j < batch_; ++j) {
      if (pos + block_bytes_ > ring_.size()) pos = 0;
      iov[j] = {const_cast<uint8_t*>(ring_.data()) + pos, block_bytes_};
      pos += block_bytes_;
    }
    msghdr msg{};
    msg.msg_iov = iov.data();
    msg.msg_iovlen = iov.size();
    size_t left = batch_ * block_bytes_;
    while (left > 0) {
      const ssize_t r = sendmsg(fds_[1], &msg, MSG_NOSIGNAL);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        pollfd pfd{fds_[1], POLLOUT, 0};
        poll(&pfd, 1, -1);
        continue;
      }
      if (r <= 0) return;
      left -= static_cast<size_t>(r);
      size_t done = static_cast<size_t>(r);
      while (done > 0 && msg.msg_iovlen > 0) {  // advance past what was sent
        if (done >= msg.msg_iov->iov_len) {
          done -= msg.msg_iov->iov_len;
          ++msg.msg_iov;
          --msg.msg_iovlen;
        } else {
          msg.msg_iov->iov_base = static_cast<uint8_t*>(msg.msg_iov->iov_base) + done;
          msg.msg_iov->iov_len -= done;
          done = 0;
        }
      }
    }
  }
}

void SocketpairWorker::StopReceiver() {
  if (fds_[0] >= 0) {
    const uint64_t stop = 0;
    (void)WriteFull(fds_[0], &stop, sizeof(stop));
    shutdown(fds_[0], SHUT_RDWR);
  }
  if (receiver_.joinable()) receiver_.join();
  for (int& fd : fds_) {
    if (fd >= 0) close(fd);
    fd = -1;
  }
}

Status SocketpairWorker::Run(PhaseClock& clock) {
  const uint64_t request = batch_ * block_bytes_;
  while (clock.Continue()) {
    const Clock::time_point t0 = Clock::now();
    if (!WriteFull(fds_[0], &request, sizeof(request))) {
      return Status::FromErrno(errno, "socketpair send");
    }
    // Like a client's get: each block into its own buffer.
    for (size_t j = 0; j < batch_; ++j) {
      if (!ReadFull(fds_[0], receive_buffers_.data() + j * block_bytes_, block_bytes_)) {
        return Status::Unavailable("socketpair server stopped");
      }
    }
    clock.Record(Clock::now() - t0, request);
  }
  StopReceiver();
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------

Status VerifyStored(BenchTarget& target, const PatternSet& pattern, size_t batch,
                    const std::vector<StoredBlock>& blocks) {
  const size_t b = pattern.block_bytes();
  AlignedBuffer buffers(batch * b);
  std::vector<BlockKey> keys;
  std::vector<MutableBuffer> bufs;
  std::vector<size_t> sizes;
  for (size_t start = 0; start < blocks.size(); start += batch) {
    const size_t n = std::min(batch, blocks.size() - start);
    keys.resize(n);
    bufs.resize(n);
    sizes.assign(n, 0);
    for (size_t j = 0; j < n; ++j) {
      keys[j] = blocks[start + j].key;
      bufs[j] = {buffers.data() + j * b, b};
    }
    KVPOOL_RETURN_IF_ERROR(target.Get(keys, bufs, sizes));
    for (size_t j = 0; j < n; ++j) {
      const StoredBlock& sb = blocks[start + j];
      KVPOOL_RETURN_IF_ERROR(
          VerifyBlock(sb.key, buffers.data() + j * b, sizes[j], pattern.slot(sb.slot), sb.size));
    }
  }
  return Status::OK();
}

}  // namespace kvpool::bench
