"""Named-barrier ids of the sm90 kernels, one numbering for forward and backward (id 0 is __syncthreads).

Hopper has 16 hardware named barriers per CTA; a barrier spanning several warpgroups is identified by id and
thread count, so two kernels never share one, but one table keeps every id visible in one place.
"""
from __future__ import annotations

from enum import IntEnum


class Bar(IntEnum):
    FWD_EPILOGUE = 1  # consumer warpgroups: O in shared memory before the TMA store
    FWD_SCHED_WG1 = 2  # 2, 3, 4: ping-pong token of consumer warpgroup 0, 1, 2
    BWD_PDS = 5  # both MMA warpgroups: dS of this Q tile is in shared memory
    BWD_DQ_FULL = 7  # 7, 8: MMA warpgroup w -> dQ writer warp: chunk w written
    BWD_DQ_EMPTY = 9  # 9, 10: dQ writer warp -> MMA warpgroup w: chunk w's buffer free again
    BWD_DS_SEND = 11  # hd256 two_cta: both MMA warpgroups -> the exchange warp: dS^T of this Q tile stored
    BWD_DS_READ = 12  # hd256 two_cta: both MMA warpgroups -> the exchange warp: dV / dQ of this Q tile done
    BWD_DQ_TOKEN = 13  # 13, 14: det_two_writers (bwd.py dq_writer_pair): writer warp k -> the other: my dQFull passed


assert max(Bar) + 1 <= 15, "Hopper has named barriers 0..15"

# The forward's speculative_exp vote (barrier.red.or of consumer warpgroup 0, 1, 2): ids 5, 6, 7, which only the
# backward kernels use (BWD_PDS, BWD_DQ_FULL): no forward kernel has any other barrier past FWD_SCHED_WG1's three.
# Four consumer warpgroups (tile_m=256) would need ping-pong ids 2-5 and vote ids 5-8: the kernel refuses ping-pong and
# persistent_dynamic (FWD_TILE_EMPTY = 8) there.
FWD_SPEC_WG1 = Bar.FWD_SCHED_WG1 + 3
# persistent_dynamic's tile handoff (the producer warp claims the next tile, the consumer warpgroups read it from shared
# memory): empty = every consumer warpgroup read the last one (the producer waits on it), full + w = the producer wrote
# the next one (consumer warpgroup w waits on it; one barrier per warpgroup, so that neither waits for the other).
# Ids 8 and 9-11, which only the backward uses; the forward's others end at FWD_SPEC_WG1's 5, 6, 7.
FWD_TILE_EMPTY = 8
FWD_TILE_FULL_WG1 = 9
