package io.quorumlog.spark;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import org.apache.spark.sql.execution.vectorized.OnHeapColumnVector;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * The column vectors of one partition reader, filled row by row and reused for
 * every batch (Spark is done with a batch before it asks for the next).
 */
final class Columns implements AutoCloseable {
    private static final int STREAM = 0;
    private static final int PARTITION = 1;
    private static final int LEDGER_ID = 2;
    private static final int ENTRY_ID = 3;
    private static final int BATCH_INDEX = 4;
    private static final int PUBLISH_TIME = 5;
    private static final int KEY = 6;
    private static final int VALUE = 7;
    private static final int PROPERTIES = 8;

    private final OnHeapColumnVector[] vectors;
    private final ColumnarBatch batch;
    private int rows;

    Columns(int capacity) {
        StructField[] fields = StreamSource.SCHEMA.fields();
        vectors = new OnHeapColumnVector[fields.length];
        for (int i = 0; i < fields.length; i++) {
            vectors[i] = new OnHeapColumnVector(capacity, fields[i].dataType());
        }
        batch = new ColumnarBatch(vectors);
    }

    int rows() {
        return rows;
    }

    void reset() {
        for (OnHeapColumnVector vector : vectors) {
            vector.reset();
        }
        rows = 0;
    }

    ColumnarBatch batch() {
        batch.setNumRows(rows);
        return batch;
    }

    /** Appends the message {@code entry} has just read. */
    void append(Plan.Range range, byte[] streamUtf8, long entryId, StreamEntry entry, byte[] buf)
            throws IOException {
        int row = rows;
        vectors[STREAM].putByteArray(row, streamUtf8, 0, streamUtf8.length);
        vectors[PARTITION].putInt(row, range.partition());
        vectors[LEDGER_ID].putLong(row, range.ledgerId());
        vectors[ENTRY_ID].putLong(row, entryId);
        vectors[BATCH_INDEX].putInt(row, entry.batchIndex);
        vectors[PUBLISH_TIME].putLong(row, entry.publishTimeMs * 1000); // microseconds
        if (entry.keyLength < 0) {
            vectors[KEY].putNull(row);
        } else {
            vectors[KEY].putByteArray(row, buf, entry.keyAt, entry.keyLength);
        }
        vectors[VALUE].putByteArray(row, buf, entry.valueAt, entry.valueLength);
        putProperties(row, entry, buf);
        rows++;
    }

    /** A map; empty (not null) for a message without properties, as the Python reader. */
    private void putProperties(int row, StreamEntry entry, byte[] buf) throws IOException {
        WritableColumnVector keys = vectors[PROPERTIES].getChild(0);
        WritableColumnVector values = vectors[PROPERTIES].getChild(1);
        int first = keys.getElementsAppended();
        if (entry.propertiesLength > 0) {
            for (Map.Entry<?, ?> property : properties(entry, buf).entrySet()) {
                byte[] name = ((String) property.getKey()).getBytes(StandardCharsets.UTF_8);
                byte[] value = ((String) property.getValue()).getBytes(StandardCharsets.UTF_8);
                keys.appendByteArray(name, 0, name.length);
                values.appendByteArray(value, 0, value.length);
            }
        }
        vectors[PROPERTIES].putArray(row, first, keys.getElementsAppended() - first);
    }

    private static Map<?, ?> properties(StreamEntry entry, byte[] buf) throws IOException {
        Object decoded;
        try {
            decoded = MsgPack.decode(buf, entry.propertiesAt, entry.propertiesLength);
        } catch (IOException e) {
            throw entry.error("message " + entry.batchIndex + " properties are malformed: "
                    + e.getMessage());
        }
        if (decoded instanceof Map<?, ?> map
                && map.values().stream().allMatch(v -> v instanceof String)) {
            return map;
        }
        throw entry.error("message " + entry.batchIndex
                + " properties are not a msgpack map of str to str");
    }

    @Override
    public void close() {
        batch.close();
    }
}
