package io.quorumlog.spark;

import java.sql.Timestamp;
import java.time.Instant;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.function.LongBinaryOperator;
import org.apache.spark.sql.catalyst.util.DateTimeUtils;
import org.apache.spark.sql.sources.And;
import org.apache.spark.sql.sources.EqualTo;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.sources.GreaterThan;
import org.apache.spark.sql.sources.GreaterThanOrEqual;
import org.apache.spark.sql.sources.In;
import org.apache.spark.sql.sources.LessThan;
import org.apache.spark.sql.sources.LessThanOrEqual;

/**
 * The filters Spark pushed, as bounds that narrow the plan's ranges the way the
 * Python source prunes its tasks (spark/_source.py {@code _prune}). Spark still
 * checks every row, so narrowing only has to be conservative: it may keep rows
 * no filter wants, never drop one a filter keeps.
 */
final class Pushdown {
    /** Inclusive bounds of one column, and the values it may take (null: any). */
    private static final class Bounds {
        long min = Long.MIN_VALUE;
        long max = Long.MAX_VALUE;
        Set<Long> values;

        void atLeast(long v) {
            min = Math.max(min, v);
        }

        void atMost(long v) {
            max = Math.min(max, v);
        }

        void in(Set<Long> in) {
            values = values == null ? in : intersect(values, in);
            atLeast(in.stream().mapToLong(Long::longValue).min().orElse(Long.MAX_VALUE));
            atMost(in.stream().mapToLong(Long::longValue).max().orElse(Long.MIN_VALUE));
        }

        boolean allows(long v) {
            return v >= min && v <= max && (values == null || values.contains(v));
        }

        private static Set<Long> intersect(Set<Long> a, Set<Long> b) {
            Set<Long> both = new HashSet<>(a);
            both.retainAll(b);
            return both;
        }
    }

    private final Bounds partition = new Bounds();
    private final Bounds ledger = new Bounds();
    private final Bounds entry = new Bounds();
    private final Bounds publishMs = new Bounds(); // the rows' publish_time, in whole ms
    private final List<Filter> used = new ArrayList<>();

    Pushdown(Filter[] filters) {
        for (Filter filter : filters) {
            if (use(filter)) {
                used.add(filter);
            }
        }
    }

    /** The filters (or And's of them) that narrowed something. */
    List<Filter> used() {
        return List.copyOf(used);
    }

    /** The plan without what no filter keeps; Spark partitions left with no range go. */
    Plan narrow(Plan plan) {
        List<Plan.Partition> partitions = new ArrayList<>();
        for (Plan.Partition p : plan.partitions) {
            List<Plan.Range> ranges = new ArrayList<>();
            for (Plan.Range r : p.ranges()) {
                Plan.Range kept = narrow(r);
                if (kept != null) {
                    ranges.add(kept);
                }
            }
            if (!ranges.isEmpty()) {
                partitions.add(new Plan.Partition(List.copyOf(ranges)));
            }
        }
        return new Plan(plan.settings, List.copyOf(partitions));
    }

    /** The part of {@code r} the filters may keep rows of; null if none. */
    private Plan.Range narrow(Plan.Range r) {
        if (!partition.allows(r.partition()) || !ledger.allows(r.ledgerId())) {
            return null;
        }
        long first = Math.max(r.firstEntry(), entry.min);
        long last = Math.min(r.lastEntry(), entry.max);
        Long low = tighter(r.publishMinMs(), publishMs.min, Math::max, Long.MIN_VALUE);
        Long high = tighter(r.publishMaxMs(), publishMs.max, Math::min, Long.MAX_VALUE);
        if (first > last || (low != null && high != null && low > high)) {
            return null;
        }
        // first_batch skips the start of the original first entry only, end_batch
        // the end of the original last one: neither applies to another entry.
        return new Plan.Range(r.stream(), r.partition(), r.ledgerId(), first, last,
                first == r.firstEntry() ? r.firstBatch() : 0,
                last == r.lastEntry() ? r.endBatch() : -1, low, high,
                r.digest(), r.macKey(), r.writeQuorum(), r.fragments());
    }

    private static Long tighter(Long planned, long pushed, LongBinaryOperator pick, long none) {
        if (planned == null) {
            return pushed == none ? null : pushed;
        }
        return pick.applyAsLong(planned, pushed);
    }

    /** Narrows the bounds by {@code f}; false if it says nothing this reader can use. */
    private boolean use(Filter f) {
        if (f instanceof And and) {
            boolean left = use(and.left()); // a row And keeps, each side keeps
            return use(and.right()) | left;
        }
        if (f instanceof In in) {
            Bounds bounds = integerColumn(in.attribute());
            Set<Long> values = new HashSet<>();
            for (Object value : in.values()) {
                Long v = integer(value);
                if (v == null && value != null) {
                    return false;
                }
                if (v != null) {
                    values.add(v); // a null in the list keeps no row
                }
            }
            if (bounds == null) {
                return false;
            }
            bounds.in(values);
            return true;
        }
        String column;
        Object value;
        if (f instanceof EqualTo c) {
            column = c.attribute();
            value = c.value();
        } else if (f instanceof GreaterThan c) {
            column = c.attribute();
            value = c.value();
        } else if (f instanceof GreaterThanOrEqual c) {
            column = c.attribute();
            value = c.value();
        } else if (f instanceof LessThan c) {
            column = c.attribute();
            value = c.value();
        } else if (f instanceof LessThanOrEqual c) {
            column = c.attribute();
            value = c.value();
        } else {
            return false; // Or, Not, IsNotNull, ...: left to Spark
        }
        if (column.equals("publish_time")) {
            return comparePublish(f, micros(value));
        }
        Bounds bounds = integerColumn(column);
        Long v = integer(value);
        if (bounds == null || v == null) {
            return false;
        }
        if (f instanceof EqualTo || f instanceof GreaterThanOrEqual) {
            bounds.atLeast(v);
        }
        if (f instanceof EqualTo || f instanceof LessThanOrEqual) {
            bounds.atMost(v);
        }
        if (f instanceof GreaterThan) {
            bounds.atLeast(v == Long.MAX_VALUE ? v : v + 1);
        }
        if (f instanceof LessThan) {
            bounds.atMost(v == Long.MIN_VALUE ? v : v - 1);
        }
        return true;
    }

    /**
     * A row's publish_time is its publish time in ms times 1000 (Columns), so
     * each comparison with µs becomes the exact bound on whole ms: e.g.
     * {@code >= 1500 µs} keeps 2 ms and up, {@code <= 1500 µs} up to 1 ms.
     */
    private boolean comparePublish(Filter f, Long us) {
        if (us == null) {
            return false;
        }
        long floor = Math.floorDiv(us, 1000L);
        long ceil = floor + (Math.floorMod(us, 1000L) == 0 ? 0 : 1);
        if (f instanceof EqualTo || f instanceof GreaterThanOrEqual) {
            publishMs.atLeast(ceil);
        }
        if (f instanceof EqualTo || f instanceof LessThanOrEqual) {
            publishMs.atMost(floor);
        }
        if (f instanceof GreaterThan) {
            publishMs.atLeast(floor + 1);
        }
        if (f instanceof LessThan) {
            publishMs.atMost(ceil - 1);
        }
        return true;
    }

    private Bounds integerColumn(String column) {
        return switch (column) {
            case "partition" -> partition;
            case "ledger_id" -> ledger;
            case "entry_id" -> entry;
            default -> null;
        };
    }

    /** An integral literal (partition is an int column, the ids long); else null. */
    private static Long integer(Object value) {
        return value instanceof Integer || value instanceof Long || value instanceof Short
                || value instanceof Byte ? Long.valueOf(((Number) value).longValue()) : null;
    }

    /**
     * A timestamp literal in µs, converted as Spark converts it: a
     * java.sql.Timestamp, or an Instant with spark.sql.datetime.java8API.enabled.
     */
    private static Long micros(Object value) {
        if (value instanceof Timestamp t) {
            return DateTimeUtils.fromJavaTimestamp(t);
        }
        if (value instanceof Instant i) {
            return DateTimeUtils.instantToMicros(i);
        }
        return null;
    }
}
