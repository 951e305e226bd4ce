package io.quorumlog.spark;

import java.io.BufferedInputStream;
import java.io.DataInputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.net.SocketTimeoutException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * One rpc connection to a bookie (src/quorumlog/rpc/_frame.py): frames are a
 * little-endian header {@code <IBBHQI} (length, magic, version, type id,
 * request id, body length), a msgpack body, then the raw payload. Requests may
 * be pipelined; responses come in any order and are matched by request id.
 * Any transport or framing error breaks the connection (the byte stream has
 * lost its framing); an ErrorResponse does not.
 */
final class BookieConnection implements AutoCloseable {
    static final int ERROR_RESPONSE = 1;
    static final int HELLO_REQUEST = 2;
    static final int HELLO_RESPONSE = 3;
    static final int READ_ENTRY_REQUEST = 1202;
    static final int READ_ENTRY_RESPONSE = 1203;
    static final int READ_BATCH_REQUEST = 1204;
    static final int READ_BATCH_RESPONSE = 1205;
    private static final int HEADER_BYTES = 20;
    private static final int MAGIC = 0xB7;
    private static final int FRAME_VERSION = 1;
    private static final long PROTOCOL_VERSION = 1;
    // Answers kept while waiting for another: a reader has at most
    // EntryFetcher.ENTRIES_IN_FLIGHT_MAX requests in flight, so more means a
    // confused peer.
    private static final int STASHED_MAX = EntryFetcher.ENTRIES_IN_FLIGHT_MAX + 16;

    /** A response: its msgpack body, and its payload {@code buf[payloadStart..)}. */
    record Response(int typeId, Map<String, Object> body, byte[] buf, int payloadStart) {}

    /** The peer answered with an ErrorResponse. */
    static final class RemoteError extends IOException {
        RemoteError(Object code, Object message) {
            super("error " + code + ": " + message);
        }
    }

    /** One connection per bookie address for one partition reader, reused across ranges. */
    static final class Pool implements AutoCloseable {
        private final Plan.Settings settings;
        private final Map<String, BookieConnection> connections = new HashMap<>();

        Pool(Plan.Settings settings) {
            this.settings = settings;
        }

        /** The open connection to {@code address}; a lost one is replaced. */
        BookieConnection get(String address) throws IOException {
            BookieConnection connection = connections.get(address);
            if (connection == null || connection.broken != null) {
                connection = open(address, settings);
                connections.put(address, connection);
            }
            return connection;
        }

        @Override
        public void close() {
            connections.values().forEach(BookieConnection::close);
        }
    }

    private final Socket socket;
    private final DataInputStream in;
    private final OutputStream out;
    private final Plan.Settings settings;
    private final Map<Long, Response> stashed = new HashMap<>();
    private long nextRequestId = 1; // 0 would be a one-way request
    private IOException broken;

    private BookieConnection(Socket socket, Plan.Settings settings) throws IOException {
        this.socket = socket;
        this.in = new DataInputStream(new BufferedInputStream(socket.getInputStream(), 1 << 16));
        this.out = socket.getOutputStream();
        this.settings = settings;
    }

    /** Connects and says hello (protocol version, our frame limit, token). */
    static BookieConnection open(String address, Plan.Settings settings) throws IOException {
        int colon = address.lastIndexOf(':');
        Socket socket = new Socket();
        try {
            socket.setTcpNoDelay(true);
            socket.setSoTimeout(settings.timeoutMs());
            socket.connect(new InetSocketAddress(address.substring(0, colon),
                    Integer.parseInt(address.substring(colon + 1))), settings.timeoutMs());
            BookieConnection connection = new BookieConnection(socket, settings);
            Map<String, Object> hello = new LinkedHashMap<>();
            hello.put("protocol_version", PROTOCOL_VERSION);
            hello.put("max_frame_bytes", (long) settings.maxFrameBytes());
            hello.put("token", settings.token());
            Object version = connection.await(connection.send(HELLO_REQUEST, hello), HELLO_RESPONSE)
                    .body().get("protocol_version");
            if (!Long.valueOf(PROTOCOL_VERSION).equals(version)) {
                throw new IOException("the bookie speaks protocol version " + version);
            }
            return connection;
        } catch (IOException e) {
            socket.close();
            throw new IOException("connect to " + address + ": " + e.getMessage(), e);
        }
    }

    /** Sends a request; returns its id for {@link #await}. */
    long send(int typeId, Map<String, Object> body) throws IOException {
        checkOpen();
        byte[] encoded = MsgPack.encodeMap(body);
        long requestId = nextRequestId++;
        ByteBuffer frame = ByteBuffer.allocate(HEADER_BYTES + encoded.length).order(ByteOrder.LITTLE_ENDIAN);
        frame.putInt(frame.capacity() - 4).put((byte) MAGIC).put((byte) FRAME_VERSION)
                .putShort((short) typeId).putLong(requestId).putInt(encoded.length).put(encoded);
        try {
            out.write(frame.array());
            out.flush();
        } catch (IOException e) {
            throw breakWith(e);
        }
        return requestId;
    }

    /** The response to {@code requestId}, which must be of type {@code typeId}. */
    Response await(long requestId, int typeId) throws IOException {
        long deadline = System.nanoTime() + settings.timeoutMs() * 1_000_000L;
        Response response;
        while ((response = stashed.remove(requestId)) == null) {
            checkOpen();
            try {
                if (System.nanoTime() > deadline) {
                    throw new SocketTimeoutException("no answer within " + settings.timeoutMs() + " ms");
                }
                receive();
            } catch (IOException e) {
                throw breakWith(e);
            }
        }
        if (response.typeId() == ERROR_RESPONSE) {
            throw new RemoteError(response.body().get("code"), response.body().get("message"));
        }
        if (response.typeId() != typeId) {
            throw breakWith(new IOException("answer of type " + response.typeId() + ", expected " + typeId));
        }
        return response;
    }

    /** Reads one frame into {@link #stashed}. */
    private void receive() throws IOException {
        byte[] headerBytes = new byte[HEADER_BYTES];
        in.readFully(headerBytes);
        ByteBuffer header = ByteBuffer.wrap(headerBytes).order(ByteOrder.LITTLE_ENDIAN);
        long frameBytes = Integer.toUnsignedLong(header.getInt(0)) + 4;
        long requestId = header.getLong(8);
        long bodyBytes = Integer.toUnsignedLong(header.getInt(16));
        if (header.get(4) != (byte) MAGIC || header.get(5) != FRAME_VERSION) {
            throw new IOException("bad frame magic or version (not a quorumlog rpc peer?)");
        }
        if (frameBytes < HEADER_BYTES + bodyBytes || frameBytes > settings.maxFrameBytes()) {
            throw new IOException("frame of " + frameBytes + " bytes with a body of " + bodyBytes
                    + " (frame limit " + settings.maxFrameBytes() + ")");
        }
        if (requestId >= nextRequestId || requestId <= 0 || stashed.size() >= STASHED_MAX) {
            throw new IOException("answer to request " + requestId + " that is not pending");
        }
        byte[] buf = new byte[(int) frameBytes - HEADER_BYTES];
        in.readFully(buf);
        if (!(MsgPack.decode(buf, 0, (int) bodyBytes) instanceof Map<?, ?> body)) {
            throw new IOException("a message body is not a msgpack map");
        }
        @SuppressWarnings("unchecked") // MsgPack maps have String keys
        Map<String, Object> fields = (Map<String, Object>) body;
        stashed.put(requestId, new Response(header.getShort(6) & 0xffff, fields, buf, (int) bodyBytes));
    }

    private void checkOpen() throws IOException {
        if (broken != null) {
            throw new IOException("connection lost earlier: " + broken.getMessage());
        }
    }

    /** Marks the connection unusable (its framing is lost) and closes it. */
    private IOException breakWith(IOException cause) {
        if (broken == null) {
            broken = cause;
            close();
        }
        return cause;
    }

    @Override
    public void close() {
        try {
            socket.close();
        } catch (IOException e) {
            // a socket that failed to close holds nothing more to release
        }
    }
}
