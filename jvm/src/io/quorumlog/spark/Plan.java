package io.quorumlog.spark;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.Serializable;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.function.Function;
import org.apache.spark.sql.connector.read.InputPartition;

/**
 * The read plan computed by the Python planner (option "plan", JSON). Parsed once
 * on the driver into plain serializable records: executors never see JSON.
 */
final class Plan {
    static final int VERSION = 1;
    // The rpc layer refuses a hello announcing less (rpc/_frame.py); a frame
    // must fit in one Java array.
    private static final long FRAME_BYTES_MIN = 4096;
    private static final long FRAME_BYTES_MAX = Integer.MAX_VALUE - 64;

    record Settings(String token, int maxFrameBytes, int timeoutMs, int batchReadEntriesMax,
                    int batchReadBytesMax, int batchRows) implements Serializable {}

    enum Digest { CRC32C, HMAC_SHA256 }

    record Fragment(long firstEntry, List<String> bookies) implements Serializable {}

    /**
     * Entries firstEntry..lastEntry (inclusive) of one ledger of one stream
     * partition; each entry is stored on writeQuorum bookies of its fragment.
     */
    record Range(String stream, int partition, long ledgerId, long firstEntry, long lastEntry,
                 int firstBatch, int endBatch, Long publishMinMs, Long publishMaxMs,
                 Digest digest, byte[] macKey, int writeQuorum, List<Fragment> fragments)
            implements Serializable {

        /** The bookies of the fragment (ensemble) holding {@code entryId}. */
        List<String> bookies(long entryId) {
            return fragments.get(fragmentIndex(entryId)).bookies();
        }

        /** Whether {@code entryId}'s fragment is wider than the write quorum (striped). */
        boolean striped(long entryId) {
            return bookies(entryId).size() > writeQuorum;
        }

        /**
         * The bookies storing {@code entryId}, in write order: ensemble indexes
         * (e % E + k) % E for k in 0..Qw-1 (ledger/_quorum.py {@code write_set}).
         */
        List<String> writeSet(long entryId) {
            List<String> ensemble = bookies(entryId);
            int size = ensemble.size();
            List<String> writeSet = new ArrayList<>(writeQuorum);
            for (int k = 0; k < writeQuorum; k++) {
                writeSet.add(ensemble.get((int) ((entryId % size + k) % size)));
            }
            return writeSet;
        }

        /** The last entry of this range in the fragment holding {@code entryId}. */
        long fragmentLast(long entryId) {
            int next = fragmentIndex(entryId) + 1;
            return next < fragments.size()
                    ? Math.min(lastEntry, fragments.get(next).firstEntry() - 1) : lastEntry;
        }

        private int fragmentIndex(long entryId) {
            int i = fragments.size() - 1;
            while (fragments.get(i).firstEntry() > entryId) {
                i--; // parse() checked that fragment 0 holds firstEntry
            }
            return i;
        }
    }

    record Partition(List<Range> ranges) implements InputPartition {}

    final Settings settings;
    final List<Partition> partitions;

    Plan(Settings settings, List<Partition> partitions) {
        this.settings = settings;
        this.partitions = partitions;
    }

    static Plan parse(String json) {
        if (json == null || json.isBlank()) {
            throw new IllegalArgumentException("quorumlog.jvm needs the option \"plan\" (JSON)");
        }
        Node plan;
        try {
            plan = new Node(new ObjectMapper().readTree(json), "");
        } catch (JsonProcessingException e) {
            throw new IllegalArgumentException("plan is not valid JSON: " + e.getOriginalMessage());
        }
        long version = plan.integer("version", 0, Long.MAX_VALUE);
        if (version != VERSION) {
            throw plan.bad("version", "is " + version + "; this reader knows plan version " + VERSION);
        }
        JsonNode token = plan.json().get("token");
        Settings settings = new Settings(token == null || token.isNull() ? null : plan.text("token"),
                (int) plan.integer("max_frame_bytes", FRAME_BYTES_MIN, FRAME_BYTES_MAX),
                (int) plan.integer("timeout_ms", 1, Integer.MAX_VALUE),
                (int) plan.integer("batch_read_entries_max", 1, Integer.MAX_VALUE),
                (int) plan.integer("batch_read_bytes_max", 1, Integer.MAX_VALUE),
                (int) plan.integer("batch_rows", 1, Integer.MAX_VALUE));
        return new Plan(settings, plan.list("partitions", p -> new Partition(p.list("ranges", Plan::range))));
    }

    private static Range range(Node r) {
        long first = r.integer("first_entry", 0, Long.MAX_VALUE);
        Digest digest = switch (r.text("digest")) {
            case "crc32c" -> Digest.CRC32C;
            case "hmac-sha256" -> Digest.HMAC_SHA256;
            default -> throw r.bad("digest", "must be \"crc32c\" or \"hmac-sha256\"");
        };
        byte[] key = new byte[0];
        if (digest == Digest.HMAC_SHA256) {
            String hex = r.text("mac_key_hex");
            if (hex.length() != 64 || !hex.chars().allMatch(c -> Character.digit(c, 16) >= 0)) {
                throw r.bad("mac_key_hex", "must be 64 hex digits (a 32-byte key)");
            }
            key = HexFormat.of().parseHex(hex);
        }
        List<Fragment> fragments = r.list("fragments", f -> new Fragment(
                f.integer("first_entry", 0, Long.MAX_VALUE), f.list("bookies", Node::address)));
        for (int i = 0; i < fragments.size(); i++) {
            if (fragments.get(i).bookies().isEmpty()
                    || (i > 0 && fragments.get(i).firstEntry() <= fragments.get(i - 1).firstEntry())) {
                throw r.bad("fragments[" + i + "]", "has no bookies or is out of first_entry order");
            }
        }
        if (fragments.isEmpty() || fragments.get(0).firstEntry() > first) {
            throw r.bad("fragments", "must include the fragment holding first_entry " + first);
        }
        long writeQuorum = r.integer("write_quorum", 1, Integer.MAX_VALUE);
        int narrowest = fragments.stream().mapToInt(f -> f.bookies().size()).min().getAsInt();
        if (writeQuorum > narrowest) {
            throw r.bad("write_quorum", "is " + writeQuorum + ", more than the " + narrowest
                    + " bookies of the smallest fragment");
        }
        return new Range(r.text("stream"), (int) r.integer("partition", 0, Integer.MAX_VALUE),
                r.integer("ledger_id", 0, Long.MAX_VALUE), first,
                r.integer("last_entry", first, Long.MAX_VALUE),
                (int) r.integer("first_batch", 0, Integer.MAX_VALUE),
                (int) r.integer("end_batch", -1, Integer.MAX_VALUE),
                r.optionalInteger("publish_min_ms"), r.optionalInteger("publish_max_ms"),
                digest, key, (int) writeQuorum, fragments);
    }

    /** A JSON node with its path, so every error names the field that is wrong. */
    private record Node(JsonNode json, String path) {
        IllegalArgumentException bad(String field, String what) {
            return new IllegalArgumentException("plan: " + join(field) + " " + what);
        }

        private String join(String field) {
            return path.isEmpty() ? field : path + "." + field;
        }

        private JsonNode field(String name, boolean ok, String expected) {
            if (!json.isObject()) {
                throw new IllegalArgumentException("plan: " + (path.isEmpty() ? "the plan" : path)
                        + " must be a JSON object");
            }
            JsonNode value = json.get(name);
            if (value == null) {
                throw bad(name, "is missing");
            }
            if (!ok) {
                throw bad(name, "must be " + expected + ", got " + value);
            }
            return value;
        }

        long integer(String name, long min, long max) {
            JsonNode value = json.get(name);
            long v = field(name, value != null && value.canConvertToExactIntegral()
                    && value.canConvertToLong(), "an integer").asLong();
            if (v < min || v > max) {
                throw bad(name, "must be in [" + min + ", " + max + "], got " + v);
            }
            return v;
        }

        Long optionalInteger(String name) {
            JsonNode value = json.get(name);
            return value == null || value.isNull() ? null : integer(name, Long.MIN_VALUE, Long.MAX_VALUE);
        }

        String text(String name) {
            JsonNode value = json.get(name);
            return field(name, value != null && value.isTextual(), "a string").asText();
        }

        <T> List<T> list(String name, Function<Node, T> item) {
            JsonNode value = json.get(name);
            field(name, value != null && value.isArray(), "a JSON array");
            List<T> items = new ArrayList<>();
            for (int i = 0; i < value.size(); i++) {
                items.add(item.apply(new Node(value.get(i), join(name) + "[" + i + "]")));
            }
            return List.copyOf(items);
        }

        /** This node as a "host:port" bookie address. */
        String address() {
            String text = json.asText();
            int colon = text.lastIndexOf(':');
            if (!json.isTextual() || colon < 1 || !text.substring(colon + 1).matches("[0-9]{1,5}")
                    || Integer.parseInt(text.substring(colon + 1)) > 65535) {
                throw new IllegalArgumentException("plan: " + path + " must be \"host:port\", got " + json);
            }
            return text;
        }
    }
}
