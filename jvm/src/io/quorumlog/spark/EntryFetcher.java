package io.quorumlog.spark;

import java.io.IOException;
import java.util.ArrayDeque;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * The verified entries of one range, in order, read with batch reads
 * (src/quorumlog/ledger/_read.py {@code _read_batches}). Requests rotate over
 * the fragment's bookies, and up to {@link #AHEAD_MAX} more are in flight while
 * the caller decodes an answer. A short answer (byte budget) is continued at
 * once; after a failed one (error, empty, bad envelope) the rest of its
 * segment is read synchronously, from each bookie of the fragment in turn.
 *
 * <p>A striped fragment (more bookies than the write quorum) holds each entry
 * on its write set only, so its entries are read one by one, as
 * {@code read_range} does: up to {@link #ENTRIES_IN_FLIGHT_MAX} ReadEntry
 * requests in flight, each to a member of the entry's write set (rotating
 * which goes first); a failed one is asked of the other members in turn.
 */
final class EntryFetcher {
    // Requests sent ahead of the answer being decoded: enough to keep the
    // bookies busy meanwhile; each answer holds at most batch_read_bytes_max.
    private static final int AHEAD_MAX = 2;
    // ReadEntry requests in flight on striped fragments (the ledger client's
    // read_entries_in_flight_max).
    static final int ENTRIES_IN_FLIGHT_MAX = 64;

    /** Payload i (of entry firstEntry + i) is {@code buf[starts[i], ends[i])}. */
    record Entries(long firstEntry, byte[] buf, int[] starts, int[] ends, int count) {}

    private record Pending(long first, long last, String bookie, BookieConnection connection,
                           long requestId, IOException sendError) {}

    /** What one answer gave: its verified prefix, and what is wrong after it (or null). */
    private record Answer(Entries entries, String error) {}

    private final Plan.Range range;
    private final Plan.Settings settings;
    private final BookieConnection.Pool pool;
    private final Envelope envelope;
    private final ArrayDeque<Pending> inFlight = new ArrayDeque<>();
    // ReadEntry requests, one entry each, in entry order; only one of
    // inFlight and entriesInFlight holds requests at a time.
    private final ArrayDeque<Pending> entriesInFlight = new ArrayDeque<>();
    private long nextToSend;
    private int rotation;
    // After a failure, entries repairFrom..repairTo are read one bookie at a
    // time; failures holds each bookie's error for entry repairFrom.
    private long repairFrom = 1;
    private long repairTo = 0;
    private final Map<String, String> failures = new LinkedHashMap<>();

    EntryFetcher(Plan.Range range, Plan.Settings settings, BookieConnection.Pool pool) {
        this.range = range;
        this.settings = settings;
        this.pool = pool;
        this.envelope = new Envelope(range);
        this.nextToSend = range.firstEntry();
    }

    /** The next verified entries (at least one), or null after the range's last entry. */
    Entries next() throws IOException {
        while (repairFrom > repairTo) {
            if (inFlight.isEmpty() && (!entriesInFlight.isEmpty()
                    || (nextToSend <= range.lastEntry() && range.striped(nextToSend)))) {
                return nextStriped();
            }
            fill();
            Pending pending = inFlight.poll();
            if (pending == null) {
                return null;
            }
            fill();
            Answer answer = collect(pending);
            long after = pending.first() + answer.entries().count();
            if (answer.error() != null) {
                repairFrom = after;
                repairTo = pending.last();
                failures.clear();
                failures.put(pending.bookie(), answer.error());
            } else if (after <= pending.last()) {
                inFlight.addFirst(send(after, pending.last(), nextBookie(after)));
            }
            if (answer.entries().count() > 0) {
                return answer.entries();
            }
        }
        return repair();
    }

    /** Sends requests until AHEAD_MAX are in flight or the range is asked for up to a striped fragment. */
    private void fill() {
        while (inFlight.size() < AHEAD_MAX && nextToSend <= range.lastEntry()
                && !range.striped(nextToSend)) {
            long last = Math.min(range.fragmentLast(nextToSend),
                    nextToSend + settings.batchReadEntriesMax() - 1);
            inFlight.add(send(nextToSend, last, nextBookie(nextToSend)));
            nextToSend = last + 1;
        }
    }

    private String nextBookie(long entryId) {
        List<String> bookies = range.bookies(entryId);
        return bookies.get(Math.floorMod(rotation++, bookies.size()));
    }

    /** Entries from repairFrom, from the first bookie that has not failed on it yet. */
    private Entries repair() throws IOException {
        for (int attempt = 0; attempt < range.bookies(repairFrom).size(); attempt++) {
            String bookie = nextBookie(repairFrom);
            if (failures.containsKey(bookie)) {
                continue;
            }
            Answer answer = collect(send(repairFrom, repairTo, bookie));
            if (answer.entries().count() == 0) {
                failures.put(bookie, answer.error());
                continue;
            }
            repairFrom += answer.entries().count();
            failures.clear();
            if (answer.error() != null) {
                failures.put(bookie, answer.error());
            }
            return answer.entries();
        }
        throw unavailable(repairFrom);
    }

    /** The next entry of a striped fragment, from the first of its write set that has it. */
    private Entries nextStriped() throws IOException {
        fillEntries();
        Pending pending = entriesInFlight.poll();
        fillEntries();
        failures.clear();
        Entries entries = collectEntry(pending);
        List<String> writeSet = range.writeSet(pending.first());
        int first = writeSet.indexOf(pending.bookie());
        for (int k = 1; entries == null && k < writeSet.size(); k++) {
            String bookie = writeSet.get((first + k) % writeSet.size());
            entries = collectEntry(sendEntry(pending.first(), bookie));
        }
        if (entries == null) {
            throw unavailable(pending.first());
        }
        return entries;
    }

    /** Sends ReadEntry requests until the window is full or the striped fragment is asked for. */
    private void fillEntries() {
        while (entriesInFlight.size() < ENTRIES_IN_FLIGHT_MAX && nextToSend <= range.lastEntry()
                && range.striped(nextToSend)) {
            List<String> writeSet = range.writeSet(nextToSend);
            entriesInFlight.add(sendEntry(nextToSend,
                    writeSet.get(Math.floorMod(rotation++, writeSet.size()))));
            nextToSend++;
        }
    }

    private IOException unavailable(long entryId) {
        StringBuilder why = new StringBuilder();
        failures.forEach((bookie, error) -> why.append("; ").append(bookie).append(": ").append(error));
        return new IOException("ledger " + range.ledgerId() + " entry " + entryId
                + ": no bookie returned it" + why);
    }

    private Pending send(long first, long last, String bookie) {
        Map<String, Object> request = new LinkedHashMap<>();
        request.put("ledger_id", range.ledgerId());
        request.put("first_entry_id", first);
        request.put("max_entries", last - first + 1);
        request.put("max_bytes", (long) settings.batchReadBytesMax());
        return send(first, last, bookie, BookieConnection.READ_BATCH_REQUEST, request);
    }

    private Pending sendEntry(long entryId, String bookie) {
        Map<String, Object> request = new LinkedHashMap<>();
        request.put("ledger_id", range.ledgerId());
        request.put("entry_id", entryId);
        request.put("flags", 0L);
        request.put("master_key", new byte[0]);
        return send(entryId, entryId, bookie, BookieConnection.READ_ENTRY_REQUEST, request);
    }

    private Pending send(long first, long last, String bookie, int typeId, Map<String, Object> request) {
        try {
            BookieConnection connection = pool.get(bookie);
            return new Pending(first, last, bookie, connection, connection.send(typeId, request), null);
        } catch (IOException e) {
            return new Pending(first, last, bookie, null, 0, e);
        }
    }

    /** The verified entry a ReadEntry request asked for, or null (its error in failures). */
    private Entries collectEntry(Pending pending) {
        String error;
        try {
            if (pending.sendError() != null) {
                throw pending.sendError();
            }
            BookieConnection.Response response = pending.connection().await(pending.requestId(),
                    BookieConnection.READ_ENTRY_RESPONSE);
            byte[] buf = response.buf();
            int start = response.payloadStart();
            if (!Long.valueOf(range.ledgerId()).equals(response.body().get("ledger_id"))
                    || !Long.valueOf(pending.first()).equals(response.body().get("entry_id"))) {
                error = "answer is not for ledger " + range.ledgerId() + " entry " + pending.first()
                        + ": " + response.body();
            } else if ((error = envelope.check(buf, start, buf.length - start, pending.first())) == null) {
                return new Entries(pending.first(), buf, new int[] {start + envelope.payloadOffset()},
                        new int[] {buf.length}, 1);
            }
        } catch (IOException e) {
            error = e.getMessage();
        }
        failures.put(pending.bookie(), String.valueOf(error));
        return null;
    }

    /** Waits for an answer and verifies the longest sound prefix of its envelopes. */
    private Answer collect(Pending pending) {
        BookieConnection.Response response;
        try {
            if (pending.sendError() != null) {
                throw pending.sendError();
            }
            response = pending.connection().await(pending.requestId(), BookieConnection.READ_BATCH_RESPONSE);
        } catch (IOException e) {
            return failed(pending, e.getMessage());
        }
        Map<String, Object> body = response.body();
        if (!Long.valueOf(range.ledgerId()).equals(body.get("ledger_id"))
                || !Long.valueOf(pending.first()).equals(body.get("first_entry_id"))
                || !(body.get("sizes") instanceof List<?> sizes)) {
            return failed(pending, "answer is not for ledger " + range.ledgerId() + " entry "
                    + pending.first() + " or has no sizes: " + body);
        }
        int count = (int) Math.min(sizes.size(), pending.last() - pending.first() + 1);
        int[] starts = new int[count];
        int[] ends = new int[count];
        byte[] buf = response.buf();
        int position = response.payloadStart();
        int good = 0;
        String error = count == 0 ? "answered no entries" : null;
        for (; good < count; good++) {
            long entryId = pending.first() + good;
            Object size = sizes.get(good);
            error = !(size instanceof Long n) || n < 0 || n > buf.length - position
                    ? "size " + size + " runs past the payload"
                    : envelope.check(buf, position, (int) (long) n, entryId);
            if (error != null) {
                error = "entry " + entryId + ": " + error;
                break;
            }
            starts[good] = position + envelope.payloadOffset();
            position += (int) (long) (Long) size;
            ends[good] = position;
        }
        return new Answer(new Entries(pending.first(), buf, starts, ends, good), error);
    }

    private static Answer failed(Pending pending, String error) {
        return new Answer(new Entries(pending.first(), new byte[0], new int[0], new int[0], 0),
                String.valueOf(error));
    }
}
