// Golden vectors for trimq's message index (tests/vectors/index.json), computed by Java itself:
// String.hashCode, and RocketMQ 4.9.3's IndexFile.putKey / IndexHeader copied verbatim from
// store/src/main/java/org/apache/rocketmq/store/index/ with the MappedFile replaced by a heap ByteBuffer.
// Run through tests/vectors/make_index.py (java IndexVectors.java > index.json).
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.List;

public class IndexVectors {
    static final int INDEX_HEADER_SIZE = 40;
    static int hashSlotSize = 4;
    static int indexSize = 20;
    static int invalidIndex = 0;

    // IndexHeader, fields and setters as in RocketMQ (AtomicLong/AtomicInteger replaced by plain fields).
    static class Header {
        final ByteBuffer byteBuffer;
        long beginTimestamp, endTimestamp, beginPhyOffset, endPhyOffset;
        int hashSlotCount, indexCount = 1;
        Header(ByteBuffer b) { byteBuffer = b; }
        void setBeginTimestamp(long v) { beginTimestamp = v; byteBuffer.putLong(0, v); }
        void setEndTimestamp(long v) { endTimestamp = v; byteBuffer.putLong(8, v); }
        void setBeginPhyOffset(long v) { beginPhyOffset = v; byteBuffer.putLong(16, v); }
        void setEndPhyOffset(long v) { endPhyOffset = v; byteBuffer.putLong(24, v); }
        void incHashSlotCount() { hashSlotCount++; byteBuffer.putInt(32, hashSlotCount); }
        void incIndexCount() { indexCount++; byteBuffer.putInt(36, indexCount); }
    }

    final int hashSlotNum, indexNum;
    final ByteBuffer mappedByteBuffer;
    final Header indexHeader;

    IndexVectors(int hashSlotNum, int indexNum) {
        this.hashSlotNum = hashSlotNum;
        this.indexNum = indexNum;
        mappedByteBuffer = ByteBuffer.allocate(INDEX_HEADER_SIZE + hashSlotNum * hashSlotSize + indexNum * indexSize);
        indexHeader = new Header(mappedByteBuffer.slice());
    }

    public int indexKeyHashMethod(final String key) {
        int keyHash = key.hashCode();
        int keyHashPositive = Math.abs(keyHash);
        if (keyHashPositive < 0)
            keyHashPositive = 0;
        return keyHashPositive;
    }

    public boolean putKey(final String key, final long phyOffset, final long storeTimestamp) {
        if (this.indexHeader.indexCount < this.indexNum) {
            int keyHash = indexKeyHashMethod(key);
            int slotPos = keyHash % this.hashSlotNum;
            int absSlotPos = INDEX_HEADER_SIZE + slotPos * hashSlotSize;
            int slotValue = this.mappedByteBuffer.getInt(absSlotPos);
            if (slotValue <= invalidIndex || slotValue > this.indexHeader.indexCount) {
                slotValue = invalidIndex;
            }
            long timeDiff = storeTimestamp - this.indexHeader.beginTimestamp;
            timeDiff = timeDiff / 1000;
            if (this.indexHeader.beginTimestamp <= 0) {
                timeDiff = 0;
            } else if (timeDiff > Integer.MAX_VALUE) {
                timeDiff = Integer.MAX_VALUE;
            } else if (timeDiff < 0) {
                timeDiff = 0;
            }
            int absIndexPos = INDEX_HEADER_SIZE + this.hashSlotNum * hashSlotSize
                + this.indexHeader.indexCount * indexSize;
            this.mappedByteBuffer.putInt(absIndexPos, keyHash);
            this.mappedByteBuffer.putLong(absIndexPos + 4, phyOffset);
            this.mappedByteBuffer.putInt(absIndexPos + 4 + 8, (int) timeDiff);
            this.mappedByteBuffer.putInt(absIndexPos + 4 + 8 + 4, slotValue);
            this.mappedByteBuffer.putInt(absSlotPos, this.indexHeader.indexCount);
            if (this.indexHeader.indexCount <= 1) {
                this.indexHeader.setBeginPhyOffset(phyOffset);
                this.indexHeader.setBeginTimestamp(storeTimestamp);
            }
            if (invalidIndex == slotValue) {
                this.indexHeader.incHashSlotCount();
            }
            this.indexHeader.incIndexCount();
            this.indexHeader.setEndPhyOffset(phyOffset);
            this.indexHeader.setEndTimestamp(storeTimestamp);
            return true;
        }
        return false;
    }

    static String q(String s) {
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            if (c == '"' || c == '\\') b.append('\\').append(c);
            else if (c < 0x20 || c > 0x7e) b.append(String.format("\\u%04x", (int) c));
            else b.append(c);
        }
        return b.append('"').toString();
    }

    static String hex(ByteBuffer b) {
        StringBuilder s = new StringBuilder();
        for (byte x : b.array()) s.append(String.format("%02x", x & 0xff));
        return s.toString();
    }

    public static void main(String[] args) {
        String[] keys = {"", "a", "hello", "Aa", "BB", "polygenelubricants", "TopicTest#order-1",
            "TopicTest#7F00000100002A9F0000000000000000", "Orders#\u65e5\u672c\u8a9e", "T#emoji \ud83d\ude00",
            "%RETRY%group#key with spaces", "zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz"};
        StringBuilder out = new StringBuilder("{\n  \"source\": \"tests/vectors/IndexVectors.java: Java String.hashCode "
            + "and RocketMQ 4.9.3 IndexFile.putKey\",\n  \"hashes\": [\n");
        IndexVectors probe = new IndexVectors(1, 2);
        for (int i = 0; i < keys.length; i++) {
            int slots = 5000000;
            out.append(String.format("    {\"key\": %s, \"hashCode\": %d, \"indexKeyHash\": %d, \"slot5000000\": %d}%s\n",
                q(keys[i]), keys[i].hashCode(), probe.indexKeyHashMethod(keys[i]),
                probe.indexKeyHashMethod(keys[i]) % slots, i + 1 < keys.length ? "," : ""));
        }
        out.append("  ],\n");
        // A small file: 4 slots, 6 entries (5 usable): collisions chain, the sixth put finds it full.
        IndexVectors f = new IndexVectors(4, 6);
        Object[][] puts = {
            {"TopicTest#order-1", 0L, 1700000000123L},
            {"TopicTest#order-2", 211L, 1700000000456L},
            {"TopicTest#order-1", 422L, 1700000002999L},
            {"Aa", 633L, 1700000003000L},
            {"BB", 844L, 1700000065432L},
            {"TopicTest#order-3", 1055L, 1700000070000L},
        };
        out.append("  \"file\": {\n    \"hashSlotNum\": 4,\n    \"indexNum\": 6,\n    \"puts\": [\n");
        for (int i = 0; i < puts.length; i++) {
            boolean ok = f.putKey((String) puts[i][0], (Long) puts[i][1], (Long) puts[i][2]);
            out.append(String.format("      {\"key\": %s, \"phyOffset\": %d, \"storeTimestamp\": %d, \"ok\": %b}%s\n",
                q((String) puts[i][0]), puts[i][1], puts[i][2], ok, i + 1 < puts.length ? "," : ""));
        }
        out.append("    ],\n    \"hex\": \"").append(hex(f.mappedByteBuffer)).append("\"\n  }\n}\n");
        System.out.print(out);
    }
}
