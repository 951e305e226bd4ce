package io.quorumlog.spark;

import java.nio.ByteBuffer;
import java.security.GeneralSecurityException;
import java.security.MessageDigest;
import java.util.Arrays;
import java.util.zip.CRC32C;
import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;

/**
 * Verifies entry envelopes of one ledger (src/quorumlog/proto/_envelope.py):
 * a big-endian header {@code >QQqIB} (ledger id, entry id, LAC, payload
 * length, digest code), the digest, then the payload. The digest covers the
 * header and the payload: CRC32C stored as a big-endian u32, or HMAC-SHA256.
 */
final class Envelope {
    static final int HEADER_BYTES = 29;
    private static final int CRC32C_CODE = 1;
    private static final int HMAC_SHA256_CODE = 2;

    private final long ledgerId;
    private final int digestCode;
    private final int digestBytes;
    private final CRC32C crc = new CRC32C();
    private final Mac mac;
    private final byte[] macOut = new byte[32];

    Envelope(Plan.Range range) {
        this.ledgerId = range.ledgerId();
        boolean keyed = range.digest() == Plan.Digest.HMAC_SHA256;
        this.digestCode = keyed ? HMAC_SHA256_CODE : CRC32C_CODE;
        this.digestBytes = keyed ? 32 : 4;
        try {
            this.mac = keyed ? Mac.getInstance("HmacSHA256") : null;
            if (keyed) {
                mac.init(new SecretKeySpec(range.macKey(), "HmacSHA256"));
            }
        } catch (GeneralSecurityException e) {
            throw new IllegalStateException("HmacSHA256 is not available: " + e.getMessage(), e);
        }
    }

    /** Where the payload of a checked envelope starts, from the envelope's start. */
    int payloadOffset() {
        return HEADER_BYTES + digestBytes;
    }

    /**
     * Null when {@code buf[offset, offset + size)} is a sound envelope of entry
     * {@code entryId}; otherwise what is wrong with it.
     */
    String check(byte[] buf, int offset, int size, long entryId) {
        if (size < HEADER_BYTES) {
            return "envelope of " + size + " bytes is shorter than its header";
        }
        ByteBuffer header = ByteBuffer.wrap(buf, offset, HEADER_BYTES); // big-endian
        long ledger = header.getLong(offset);
        long entry = header.getLong(offset + 8);
        long lac = header.getLong(offset + 16);
        long length = Integer.toUnsignedLong(header.getInt(offset + 24));
        int code = buf[offset + 28] & 0xff;
        if (ledger != ledgerId || entry != entryId) {
            return "envelope is for " + Long.toUnsignedString(ledger) + ":"
                    + Long.toUnsignedString(entry);
        }
        if (code != digestCode) {
            return "digest type " + digestName(code) + ", the ledger uses " + digestName(digestCode);
        }
        if (size != HEADER_BYTES + digestBytes + length) {
            return "envelope says " + length + " payload bytes, has "
                    + (size - HEADER_BYTES - digestBytes);
        }
        if (lac < -1) {
            return "envelope has LAC " + lac + " < -1";
        }
        int payload = offset + HEADER_BYTES + digestBytes;
        return digestCode == CRC32C_CODE ? checkCrc(buf, offset, payload, (int) length)
                : checkMac(buf, offset, payload, (int) length);
    }

    private String checkCrc(byte[] buf, int offset, int payload, int length) {
        crc.reset();
        crc.update(buf, offset, HEADER_BYTES);
        crc.update(buf, payload, length);
        long stored = Integer.toUnsignedLong(ByteBuffer.wrap(buf).getInt(offset + HEADER_BYTES));
        return crc.getValue() == stored ? null : "CRC32C digest mismatch";
    }

    private String checkMac(byte[] buf, int offset, int payload, int length) {
        mac.update(buf, offset, HEADER_BYTES);
        mac.update(buf, payload, length);
        try {
            mac.doFinal(macOut, 0);
        } catch (GeneralSecurityException e) {
            throw new IllegalStateException(e);
        }
        byte[] stored = Arrays.copyOfRange(buf, offset + HEADER_BYTES, payload);
        return MessageDigest.isEqual(macOut, stored)
                ? null : "HMAC-SHA256 digest mismatch (corrupt entry or wrong password)";
    }

    private static String digestName(int code) {
        return switch (code) {
            case CRC32C_CODE -> "crc32c";
            case HMAC_SHA256_CODE -> "hmac-sha256";
            default -> "unknown (" + code + ")";
        };
    }
}
