package io.quorumlog.spark;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;

/**
 * The messages of one stream entry (src/quorumlog/stream/_entry.py), little-endian:
 * {@code "QS" | version u8 | flags u8 | count u32 | message*count}, message :=
 * {@code publish_time_ms i64 | key_length i32 (-1: none) | properties_length u32 |
 * value_length u32 | key | properties | value}. The whole entry is checked when
 * it is opened (as the C decoder {@code stream_columns} does), so a broken entry
 * yields no rows at all; then its messages are handed out one at a time.
 */
final class StreamEntry {
    static final int ENTRY_HEADER_BYTES = 8;
    static final int MESSAGE_HEADER_BYTES = 20;
    private static final int FORMAT_VERSION = 1;
    // The writers' bound (BATCH_MESSAGES_MAX): more is a corrupt count.
    private static final long MESSAGES_MAX = 100_000;

    private final ByteBuffer in; // the whole answer, little-endian
    private final long ledgerId;
    private final long entryId;
    private final int count;
    private int offset;
    private int index;
    // The message just read by next().
    int batchIndex;
    long publishTimeMs;
    int keyAt;
    int keyLength; // -1: no key
    int propertiesAt;
    int propertiesLength;
    int valueAt;
    int valueLength;

    private StreamEntry(ByteBuffer in, int start, int count, long ledgerId, long entryId) {
        this.in = in;
        this.offset = start + ENTRY_HEADER_BYTES;
        this.count = count;
        this.ledgerId = ledgerId;
        this.entryId = entryId;
    }

    /** Checks the entry {@code buf[start, end)} and opens it at its first message. */
    static StreamEntry open(byte[] buf, int start, int end, long ledgerId, long entryId)
            throws IOException {
        if (end - start < ENTRY_HEADER_BYTES) {
            throw error(ledgerId, entryId, "entry of " + (end - start)
                    + " bytes is shorter than its header");
        }
        if (buf[start] != 'Q' || buf[start + 1] != 'S') {
            throw error(ledgerId, entryId, "entry does not start with the stream magic \"QS\": "
                    + "the ledger is not a stream ledger");
        }
        if (buf[start + 2] != FORMAT_VERSION) {
            throw error(ledgerId, entryId, "entry format version " + (buf[start + 2] & 0xff)
                    + " is unknown (this reader reads " + FORMAT_VERSION + ")");
        }
        // The flags byte is not checked: the Python decoder ignores it, and the
        // rows must be the same whichever reader runs.
        ByteBuffer in = ByteBuffer.wrap(buf).order(ByteOrder.LITTLE_ENDIAN);
        long count = Integer.toUnsignedLong(in.getInt(start + 4));
        if (count < 1 || count > MESSAGES_MAX) {
            throw error(ledgerId, entryId, "entry claims " + count + " messages");
        }
        long offset = start + ENTRY_HEADER_BYTES;
        for (int k = 0; k < count; k++) {
            if (end - offset < MESSAGE_HEADER_BYTES) {
                throw error(ledgerId, entryId, "message " + k + " header runs past the entry end");
            }
            int at = (int) offset;
            long keyLength = in.getInt(at + 8);
            long body = Math.max(keyLength, 0) + Integer.toUnsignedLong(in.getInt(at + 12))
                    + Integer.toUnsignedLong(in.getInt(at + 16));
            if (keyLength < -1 || body > end - offset - MESSAGE_HEADER_BYTES) {
                throw error(ledgerId, entryId, "message " + k + " lengths run past the entry end");
            }
            offset += MESSAGE_HEADER_BYTES + body;
        }
        if (offset != end) {
            throw error(ledgerId, entryId, "entry has " + (end - offset)
                    + " trailing bytes after its messages");
        }
        return new StreamEntry(in, start, (int) count, ledgerId, entryId);
    }

    /** Reads the next message into the fields; false after the last. */
    boolean next() {
        if (index >= count) {
            return false;
        }
        int at = offset;
        batchIndex = index++;
        publishTimeMs = in.getLong(at);
        keyLength = in.getInt(at + 8);
        propertiesLength = in.getInt(at + 12); // checked by open(): below the entry size
        valueLength = in.getInt(at + 16);
        keyAt = at + MESSAGE_HEADER_BYTES;
        propertiesAt = keyAt + Math.max(keyLength, 0);
        valueAt = propertiesAt + propertiesLength;
        offset = valueAt + valueLength;
        return true;
    }

    IOException error(String what) {
        return error(ledgerId, entryId, what);
    }

    private static IOException error(long ledgerId, long entryId, String what) {
        return new IOException("ledger " + ledgerId + " entry " + entryId + ": " + what);
    }
}
