"""quorumlog's loops over many entries in one call, in C.

Each function does what a Python loop in quorumlog did entry by entry (a
struct unpack, two CRC32C calls and a few comparisons): the same checks, in
the same order, stopping where the Python loop stopped. quorumlog's tests
compare them with its per-entry Python decoders on valid and damaged input.

- :func:`envelope_bounds`: a batch read's entry envelopes (the ledger client);
- :func:`add_lacs`: a batch add's envelopes (the bookie);
- :func:`frames_following`: entry log frames back to back (the bookie's reads);
- :func:`stream_columns`: stream entries into Arrow column buffers (the Spark reader).
"""

from quorumlog_native._walk import (
    add_lacs,
    crc32c,
    envelope_bounds,
    frames_following,
    hardware,
    stream_columns,
)

__all__ = ["add_lacs", "crc32c", "envelope_bounds", "frames_following", "hardware",
           "stream_columns"]
