// Sizes the rvd.v1 protocol fixes, shared by the daemon and the clients so
// that both sides agree on them (see rvd.proto: MeasureChunk, Measure).
#ifndef RVD_PROTO_RVD_V1_LIMITS_H_
#define RVD_PROTO_RVD_V1_LIMITS_H_

#include <cstdint>

namespace rvd::v1 {

// The largest data payload of one MeasureChunk; clients send chunks of
// exactly this size but the last of each tensor.
inline constexpr uint64_t kMaxChunkBytes = uint64_t{4} << 20;

// The largest gRPC message rvd receives: a chunk, or a unary Measure with
// its tensors. Room beyond a chunk is for the header (up to 4096 tensor
// specs with names of up to 1 KiB). A larger message is refused by gRPC
// (RESOURCE_EXHAUSTED) before rvd sees it; larger tensors go by stream.
inline constexpr int kMaxRequestMessageBytes = 16 << 20;

// The largest gRPC message a client accepts from rvd (a history reply can
// hold many measurements).
inline constexpr int kMaxReplyMessageBytes = 64 << 20;

}  // namespace rvd::v1

#endif  // RVD_PROTO_RVD_V1_LIMITS_H_
