package io.quorumlog.spark;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * Reads the ranges of one partition in order and returns their messages in
 * (entry, batch index) order as batches of at most batch_rows rows.
 */
final class StreamPartitionReader implements PartitionReader<ColumnarBatch> {
    private final Plan.Partition partition;
    private final Plan.Settings settings;
    private final BookieConnection.Pool pool;
    private final Columns columns;
    private int rangeIndex = -1;
    private Plan.Range range;
    private byte[] streamUtf8;
    private EntryFetcher fetcher;
    private EntryFetcher.Entries entries; // the answer being decoded
    private int entryIndex;
    private StreamEntry entry; // the entry being decoded
    private long entryId;
    private boolean done;

    StreamPartitionReader(Plan.Partition partition, Plan.Settings settings) {
        this.partition = partition;
        this.settings = settings;
        this.pool = new BookieConnection.Pool(settings);
        this.columns = new Columns(settings.batchRows());
    }

    @Override
    public boolean next() throws IOException {
        columns.reset();
        while (columns.rows() < settings.batchRows()) {
            if (entry != null && entry.next()) {
                if (keep()) {
                    columns.append(range, streamUtf8, entryId, entry, entries.buf());
                }
            } else if (!nextEntry()) {
                break;
            }
        }
        return columns.rows() > 0;
    }

    @Override
    public ColumnarBatch get() {
        return columns.batch();
    }

    /** Whether the message just read is inside the range's batch and time bounds. */
    private boolean keep() {
        if (entryId == range.firstEntry() && entry.batchIndex < range.firstBatch()) {
            return false;
        }
        if (entryId == range.lastEntry() && range.endBatch() > 0
                && entry.batchIndex >= range.endBatch()) {
            return false;
        }
        long publishMs = entry.publishTimeMs;
        return (range.publishMinMs() == null || publishMs >= range.publishMinMs())
                && (range.publishMaxMs() == null || publishMs <= range.publishMaxMs());
    }

    /** Opens the next entry of the partition; false when every range is read. */
    private boolean nextEntry() throws IOException {
        entry = null;
        while (entries == null || entryIndex >= entries.count()) {
            if (done) {
                return false;
            }
            entries = fetcher == null ? null : fetcher.next();
            entryIndex = 0;
            if (entries == null && !nextRange()) {
                done = true;
                return false;
            }
        }
        entryId = entries.firstEntry() + entryIndex;
        entry = StreamEntry.open(entries.buf(), entries.starts()[entryIndex],
                entries.ends()[entryIndex], range.ledgerId(), entryId);
        entryIndex++;
        return true;
    }

    private boolean nextRange() {
        if (++rangeIndex >= partition.ranges().size()) {
            return false;
        }
        range = partition.ranges().get(rangeIndex);
        streamUtf8 = range.stream().getBytes(StandardCharsets.UTF_8);
        fetcher = new EntryFetcher(range, settings, pool);
        return true;
    }

    @Override
    public void close() {
        pool.close();
        columns.close();
    }
}
