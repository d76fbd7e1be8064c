#pragma once
// The daemons' own requests to one another (GPU_LINK_JOIN, GPU_OFFER, GPU_SEND: device links
// between gpu tiers, daemon/gpu_links.h; SESSION_VERSIONS: which session records a peer lacks,
// daemon/cluster_node.h) on a Client that a daemon connected to its peer. Not part of the public
// API: a daemon refuses them from anything but a peer's connection.
//
// Thread safety: as the Client (one thread at a time).

#include <kvpool/client.h>

#include "control.pb.h"

namespace kvpool::client {

// Each sends its request and waits for the answer within the client's timeout; the answer's
// status, or the transport's error.
Status PeerCall(Client& client, const wire::GpuLinkJoinRequest& req,
                wire::GpuLinkJoinResponse* resp);
Status PeerCall(Client& client, const wire::GpuOfferRequest& req, wire::GpuOfferResponse* resp);
Status PeerCall(Client& client, const wire::GpuSendRequest& req, wire::GpuSendResponse* resp);
Status PeerCall(Client& client, const wire::SessionVersionsRequest& req,
                wire::SessionVersionsResponse* resp);

}  // namespace kvpool::client
