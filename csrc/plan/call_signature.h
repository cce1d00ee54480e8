// The signature of a call: a 32-bit value that every rank making the same call computes
// identically (it does not depend on the rank) and that differs, with high probability, when the
// ranks disagree on anything that decides where bytes go: mode, layout, batch, head dim, element
// size, the resolved sequence and head splits, or the tag.
//
// The handshake carries it: a receiver releases its window for a call by writing the call's
// signature, and a sender writes into that window only once it reads its own call's signature
// there. Ranks that disagree therefore never copy into each other's windows; they wait, and the
// watchdog reports both signatures. It is a constant of the call, so a CUDA graph that captured
// the call stays correct on every replay.
//
// A signature never equals 0 or 1 (the handshake's other flag values): its top bit is set.
#pragma once

#include <cstdint>
#include <string>

#include "plan/plan.h"

namespace fast_ulysses {

// A 64-bit FNV-1a hash of the request's rank-independent fields.
uint64_t request_hash(const PlanRequest& request);
// A 64-bit FNV-1a hash of a tag's bytes.
uint64_t tag_hash(const std::string& tag);
// The handshake value of a call: request and tag hashes mixed into 31 bits, top bit set.
uint32_t call_signature(uint64_t request_hash, uint64_t tag_hash);

}  // namespace fast_ulysses
