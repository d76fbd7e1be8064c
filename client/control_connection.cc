#include "client/control_connection.h"

#include "common/hello_auth.h"
#include "transport/address.h"

namespace kvpool::client {

using transport::ControlChannel;
using transport::FrameHeader;

Status FromWire(const wire::Status& s) {
  if (s.code() == 0) return Status::OK();
  return Status(static_cast<StatusCode>(s.code()), s.message());
}

ControlConnection::ControlConnection(const ClientOptions& options) : options_(options) {
  // Responses are bounded by what we ask for; accept any frame the protocol can express.
  recv_limits_.max_body_bytes = 1u << 30;
  recv_limits_.max_payload_bytes = UINT32_MAX;
}

std::chrono::milliseconds ControlConnection::connect_timeout() const {
  return options_.connect_timeout.count() > 0 ? options_.connect_timeout : options_.timeout;
}

Status ControlConnection::Dial() {
  channel_.reset();
  if (transport::IsTlsAddress(options_.address) && tls_ == nullptr) {
    KVPOOL_ASSIGN_OR_RETURN(
        tls_, transport::TlsClientContext::Create(
                  {options_.tls_cert_file, options_.tls_key_file, options_.tls_ca_file}));
  }
  KVPOOL_ASSIGN_OR_RETURN(channel_,
                          ControlChannel::Connect(options_.address, connect_timeout(), tls_));
  channel_->set_busy_poll(options_.busy_poll);
  return Status::OK();
}

Status ControlConnection::Hello(wire::HelloRequest req, wire::HelloResponse* resp) {
  const auto hello_deadline = std::chrono::steady_clock::now() + connect_timeout();
  // The secret this client holds: the namespace's (or the admin's) credential, else the cluster
  // secret. Holding one, it asks the daemon to prove it too (mutual authentication): a daemon
  // that admits it without that proof is not trusted.
  const std::string& secret =
      options_.credential.empty() ? options_.cluster_secret : options_.credential;
  const std::string client_challenge = secret.empty() ? "" : NewHelloChallenge();
  req.set_client_challenge(client_challenge);
  Status st = ExchangeOnce(wire::HELLO, req, {}, resp, hello_deadline);
  bool proved = false;
  if (st.ok() && !resp->challenge().empty() && resp->status().code() != 0) {
    // The daemon wants proof of a credential: the namespace's (or the admin's), or the
    // cluster secret.
    if (secret.empty()) {
      Close();
      return Status::PermissionDenied(
          "kvpoold at " + options_.address + " refused namespace '" + options_.namespace_name +
          "' without a credential (" + resp->status().message() +
          "; ClientOptions::credential, or the cluster secret for a daemon in cluster mode)");
    }
    if (resp->challenge().size() != kHelloChallengeBytes) {
      Close();
      return Status::PermissionDenied("kvpoold at " + options_.address + " sent a challenge of " +
                                      std::to_string(resp->challenge().size()) + " bytes, not " +
                                      std::to_string(kHelloChallengeBytes));
    }
    req.set_auth(HelloProof(secret, resp->challenge(), options_.namespace_name));
    resp->Clear();
    st = ExchangeOnce(wire::HELLO, req, {}, resp, hello_deadline);
    proved = true;
  }
  if (st.ok() && resp->status().code() == 0 && !secret.empty() &&
      (!proved || !VerifyHelloServerProof(secret, client_challenge, options_.namespace_name,
                                          resp->server_proof()))) {
    // It admitted this client without a proof of the secret, or without showing that it holds
    // the secret itself.
    Close();
    return Status::PermissionDenied(
        "kvpoold at " + options_.address +
        " did not prove that it holds the secret this client holds (ClientOptions::" +
        (options_.credential.empty() ? "cluster_secret" : "credential") +
        "): it is not the daemon (or peer) it claims to be, or it does not guard namespace '" +
        options_.namespace_name + "' with that secret");
  }
  if (!st.ok()) {
    Close();
    return st;
  }
  st = FromWire(resp->status());
  if (!st.ok()) {
    Close();
    return st.WithContext("kvpoold refused the connection");
  }
  fresh_ = true;
  return Status::OK();
}

void ControlConnection::Close() {
  channel_.reset();
  fresh_ = false;
}

Result<uint64_t> ControlConnection::SendFrame(uint16_t type, const std::string& body,
                                              std::span<const iovec> payload, Deadline deadline) {
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

Status ControlConnection::ReceiveFrame(uint16_t type, uint64_t id, std::string* body,
                                       FrameHeader* header, Deadline deadline) {
  KVPOOL_ASSIGN_OR_RETURN(*header, channel_->ReceiveHeader(recv_limits_, deadline));
  if (header->type != type || header->request_id != id) {
    const FrameHeader rh = *header;
    Close();
    return Status::Internal("kvpoold answered another request (type " + std::to_string(rh.type) +
                            ", id " + std::to_string(rh.request_id) + ")");
  }
  body->assign(header->body_bytes, '\0');
  return channel_->ReceiveInto(body->data(), body->size(), deadline);
}

Status ControlConnection::FinishResponse(const FrameHeader& header, FrameHeader* out_header,
                                         Deadline deadline) {
  if (out_header != nullptr) {
    *out_header = header;
  } else if (header.payload_bytes > 0) {
    KVPOOL_RETURN_IF_ERROR(channel_->Discard(header.payload_bytes, deadline));
  }
  return Status::OK();
}

Status ControlConnection::ReceivePayload(void* dst, size_t n, Deadline deadline) {
  return channel_->ReceiveInto(dst, n, deadline);
}

Status ControlConnection::DiscardPayload(size_t n, Deadline deadline) {
  return channel_->Discard(n, deadline);
}

std::vector<int> ControlConnection::TakeReceivedFds() { return channel_->TakeReceivedFds(); }

}  // namespace kvpool::client
