package io.quorumlog.spark;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * The msgpack subset the rpc messages and message properties use. msgspec
 * encodes a Struct as a map keyed by field name (every field, defaults too), so
 * a message is a Map here; unknown keys are simply not looked at.
 */
final class MsgPack {
    // Rpc bodies nest two levels at most: the bound keeps garbage from
    // overflowing the stack.
    private static final int DEPTH_MAX = 16;

    private MsgPack() {}

    /** Encodes a map of str keys to Long, String, Boolean, byte[] or null values. */
    static byte[] encodeMap(Map<String, Object> fields) {
        ByteArrayOutputStream out = new ByteArrayOutputStream(64);
        out.write(0xdf);
        be(out, fields.size(), 4);
        for (Map.Entry<String, Object> field : fields.entrySet()) {
            string(out, field.getKey());
            Object value = field.getValue();
            if (value == null) {
                out.write(0xc0);
            } else if (value instanceof Boolean b) {
                out.write(b ? 0xc3 : 0xc2);
            } else if (value instanceof Long n) {
                integer(out, n);
            } else if (value instanceof String s) {
                string(out, s);
            } else if (value instanceof byte[] bytes) {
                out.write(0xc6);
                be(out, bytes.length, 4);
                out.write(bytes, 0, bytes.length);
            } else {
                throw new IllegalArgumentException("cannot encode " + value.getClass());
            }
        }
        return out.toByteArray();
    }

    private static void string(ByteArrayOutputStream out, String s) {
        byte[] utf8 = s.getBytes(StandardCharsets.UTF_8);
        out.write(0xdb);
        be(out, utf8.length, 4);
        out.write(utf8, 0, utf8.length);
    }

    private static void integer(ByteArrayOutputStream out, long n) {
        if (n >= -32 && n < 128) {
            out.write((int) n & 0xff); // positive or negative fixint
        } else {
            out.write(n >= 0 ? 0xcf : 0xd3);
            be(out, n, 8);
        }
    }

    private static void be(ByteArrayOutputStream out, long value, int bytes) {
        for (int shift = 8 * (bytes - 1); shift >= 0; shift -= 8) {
            out.write((int) (value >>> shift) & 0xff);
        }
    }

    /** Decodes exactly {@code length} bytes holding one value: Map (str keys, in
     *  order), List, String, byte[], Long, Double, Boolean or null. */
    static Object decode(byte[] buf, int offset, int length) throws IOException {
        Reader reader = new Reader(ByteBuffer.wrap(buf, offset, length));
        Object value = reader.value(0);
        if (reader.in.hasRemaining()) {
            throw new IOException("msgpack: " + reader.in.remaining() + " trailing bytes");
        }
        return value;
    }

    private record Reader(ByteBuffer in) {
        Object value(int depth) throws IOException {
            if (depth > DEPTH_MAX) {
                throw new IOException("msgpack: nested deeper than " + DEPTH_MAX);
            }
            int b = (int) u(1);
            if (b <= 0x7f || b >= 0xe0) {
                return (long) (byte) b; // positive and negative fixint
            }
            if (b <= 0x8f) {
                return map(b & 0x0f, depth);
            }
            if (b <= 0x9f) {
                return array(b & 0x0f, depth);
            }
            if (b <= 0xbf) {
                return text(b & 0x1f);
            }
            return switch (b) {
                case 0xc0 -> null;
                case 0xc2 -> false;
                case 0xc3 -> true;
                case 0xc4, 0xc5, 0xc6 -> bytes(size(1 << (b - 0xc4)));
                case 0xca -> (double) Float.intBitsToFloat((int) u(4));
                case 0xcb -> Double.longBitsToDouble(u(8));
                case 0xcc, 0xcd, 0xce -> u(1 << (b - 0xcc));
                case 0xcf -> nonNegative(u(8));
                case 0xd0 -> (long) (byte) u(1);
                case 0xd1 -> (long) (short) u(2);
                case 0xd2 -> (long) (int) u(4);
                case 0xd3 -> u(8);
                case 0xd9, 0xda, 0xdb -> text(size(1 << (b - 0xd9)));
                case 0xdc, 0xdd -> array(size(2 << (b - 0xdc)), depth);
                case 0xde, 0xdf -> map(size(2 << (b - 0xde)), depth);
                default -> throw new IOException(String.format("msgpack: unsupported type 0x%02x", b));
            };
        }

        private Map<String, Object> map(int size, int depth) throws IOException {
            Map<String, Object> map = new LinkedHashMap<>();
            for (int i = 0; i < size; i++) {
                if (!(value(depth + 1) instanceof String key)) {
                    throw new IOException("msgpack: a map key is not a string");
                }
                map.put(key, value(depth + 1));
            }
            return map;
        }

        private List<Object> array(int size, int depth) throws IOException {
            List<Object> list = new ArrayList<>(Math.min(size, in.remaining()));
            for (int i = 0; i < size; i++) {
                list.add(value(depth + 1));
            }
            return list;
        }

        private String text(int length) throws IOException {
            try {
                // Strict like msgspec: invalid UTF-8 is an error, not replaced.
                return StandardCharsets.UTF_8.newDecoder().decode(slice(length)).toString();
            } catch (CharacterCodingException e) {
                throw new IOException("msgpack: a string is not valid UTF-8");
            }
        }

        private byte[] bytes(int length) throws IOException {
            byte[] out = new byte[length];
            slice(length).get(out);
            return out;
        }

        private ByteBuffer slice(int length) throws IOException {
            if (length > in.remaining()) {
                throw new IOException("msgpack: a length of " + length + " runs past the end");
            }
            ByteBuffer part = in.slice(in.position(), length);
            in.position(in.position() + length);
            return part;
        }

        private int size(int bytes) throws IOException {
            long size = u(bytes); // elements take a byte at least, so it is bounded too
            if (size > in.remaining()) {
                throw new IOException("msgpack: a length of " + size + " runs past the end");
            }
            return (int) size;
        }

        private static long nonNegative(long v) throws IOException {
            if (v < 0) {
                throw new IOException("msgpack: a length or integer out of range");
            }
            return v;
        }

        private long u(int bytes) throws IOException {
            if (bytes > in.remaining()) {
                throw new IOException("msgpack: truncated value");
            }
            long v = 0;
            for (int i = 0; i < bytes; i++) {
                v = (v << 8) | (in.get() & 0xff);
            }
            return v;
        }
    }
}
