package io.quorumlog.spark;

import java.util.Arrays;
import java.util.EnumSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.catalog.Column;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownFilters;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * {@code spark.read.format("quorumlog.jvm").option("plan", json)}: reads stream
 * entries straight from the bookies in the executors' JVMs, with no Python
 * worker. The Python side plans the read (which ledgers, entries, bookies) and
 * passes the plan as JSON; see {@link Plan}.
 */
public final class StreamSource implements TableProvider, DataSourceRegister {
    /** The Python source's schema (quorumlog/spark/_arrow.py), field for field. */
    static final StructType SCHEMA = new StructType()
            .add("stream", DataTypes.StringType, true)
            .add("partition", DataTypes.IntegerType, true)
            .add("ledger_id", DataTypes.LongType, true)
            .add("entry_id", DataTypes.LongType, true)
            .add("batch_index", DataTypes.IntegerType, true)
            .add("publish_time", DataTypes.TimestampType, true)
            .add("key", DataTypes.BinaryType, true)
            .add("value", DataTypes.BinaryType, true)
            .add("properties", DataTypes.createMapType(
                    DataTypes.StringType, DataTypes.StringType, true), true);

    @Override
    public String shortName() {
        return "quorumlog.jvm";
    }

    @Override
    public StructType inferSchema(CaseInsensitiveStringMap options) {
        return SCHEMA;
    }

    @Override
    public boolean supportsExternalMetadata() {
        return false;
    }

    @Override
    public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
        // Parsed here, on the driver, so a bad plan fails at load() with its message.
        return new StreamTable(Plan.parse(new CaseInsensitiveStringMap(properties).get("plan")));
    }

    /** The planned read as a table: batch reads only. */
    private record StreamTable(Plan plan) implements SupportsRead {
        @Override
        public String name() {
            return "quorumlog.jvm";
        }

        @Override
        public Column[] columns() {
            return Arrays.stream(SCHEMA.fields())
                    .map(f -> Column.create(f.name(), f.dataType(), f.nullable()))
                    .toArray(Column[]::new);
        }

        @Override
        public Set<TableCapability> capabilities() {
            return EnumSet.of(TableCapability.BATCH_READ);
        }

        @Override
        public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
            return new StreamScanBuilder(plan);
        }
    }

    /**
     * Narrows the plan by the filters Spark pushes ({@link Pushdown}) and hands
     * them all back: Spark still filters every row, the plan only reads less.
     */
    private static final class StreamScanBuilder implements SupportsPushDownFilters {
        private final Plan plan;
        private Pushdown pushdown = new Pushdown(new Filter[0]);

        StreamScanBuilder(Plan plan) {
            this.plan = plan;
        }

        @Override
        public Filter[] pushFilters(Filter[] filters) {
            pushdown = new Pushdown(filters);
            return filters;
        }

        @Override
        public Filter[] pushedFilters() {
            return pushdown.used().toArray(new Filter[0]);
        }

        @Override
        public Scan build() {
            return new StreamScan(pushdown.narrow(plan), pushdown.used());
        }
    }

    /** Scan and batch in one: the (narrowed) plan fixes everything. */
    private record StreamScan(Plan plan, List<Filter> pushed) implements Scan, Batch {
        @Override
        public StructType readSchema() {
            return SCHEMA;
        }

        @Override
        public String description() {
            return "quorumlog.jvm (" + plan.partitions.size() + " partitions"
                    + (pushed.isEmpty() ? ")" : ", pushed " + pushed + ")");
        }

        @Override
        public ColumnarSupportMode columnarSupportMode() {
            return ColumnarSupportMode.SUPPORTED;
        }

        @Override
        public Batch toBatch() {
            return this;
        }

        @Override
        public InputPartition[] planInputPartitions() {
            return plan.partitions.toArray(new InputPartition[0]);
        }

        @Override
        public PartitionReaderFactory createReaderFactory() {
            return new ReaderFactory(plan.settings);
        }
    }

    /** Sent to the executors: the connection and batching settings of the plan. */
    private record ReaderFactory(Plan.Settings settings) implements PartitionReaderFactory {
        @Override
        public boolean supportColumnarReads(InputPartition partition) {
            return true;
        }

        @Override
        public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
            return new StreamPartitionReader((Plan.Partition) partition, settings);
        }

        @Override
        public PartitionReader<InternalRow> createReader(InputPartition partition) {
            throw new UnsupportedOperationException("quorumlog.jvm reads columnar batches only");
        }
    }
}
