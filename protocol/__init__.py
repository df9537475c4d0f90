"""protocol: the pure layer of sharecoord (no I/O): the wire schema and its codecs,
state batches and their merge, the log's records, replay and the shard's rules.

``combine_state_batches(current, new, start_offset)`` and ``StateBatch`` are exported
here, as the semantics document names them.
"""

from protocol.batches import combine_state_batches
from protocol.state_batch import StateBatch

__all__ = ["StateBatch", "combine_state_batches"]
