// Connects the full mesh of Gloo's TCP pairs for one process group, keeping stray connections out.
//
// Gloo's TCP transport gives every pair of ranks a listening port of its own and takes the first
// connection that reaches it, with no handshake: a stranger that connects first takes a peer's
// place, and bytes Gloo cannot parse end the process. connectMesh makes the mesh so that neither
// can happen:
// - every listening socket carries a socket filter that passes only TCP segments without payload:
//   connections open, but no byte reaches Gloo yet;
// - every rank publishes in the store both ends of each connection it holds, reads every rank's
//   record, and so reaches the same verdict as every other rank: when each connection joins the
//   two ranks that the store announced, the filters come off (then a barrier, so that no rank sends
//   before its peers can read); otherwise the stray connections are logged on stderr with their
//   addresses, the whole mesh is dropped and made again on new ports.
#pragma once
#include <chrono>
#include <memory>
#include <string>

namespace gloo {
class Context;
namespace rendezvous {
class Store;
}
}  // namespace gloo

namespace accordion {

struct MeshOptions {
  int rank = 0, size = 1;
  std::string hostname;  // the address this rank's pairs listen on
  std::chrono::milliseconds timeout{0};  // the group's
  int attempts = 3;  // meshes made before stray connections end the start-up
};

// Throws EngineError ERR_RENDEZVOUS naming the ranks that could not connect, or the stray addresses
// that kept taking their places.
std::shared_ptr<gloo::Context> connectMesh(const MeshOptions& options, gloo::rendezvous::Store& store);

}  // namespace accordion
