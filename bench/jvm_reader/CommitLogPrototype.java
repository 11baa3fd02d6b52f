package org.trimq.bench;

import java.io.File;
import java.io.IOException;
import java.io.RandomAccessFile;
import java.io.Serializable;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.util.*;
import java.util.zip.CRC32;

import org.apache.spark.sql.connector.catalog.*;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.*;
import org.apache.spark.sql.execution.vectorized.OnHeapColumnVector;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;
import org.apache.spark.sql.types.*;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * A measurement, not the data source: what a reader in the JVM reaches on the commit log (issue 21, bench only).
 *
 * <p>It reads clean stores only: every record a message of IPv4 hosts whose field lengths add up, each segment
 * ending in the blank filler or zeros. Anything else is an error, never a guess. It gives the rows of
 * {@code trimq-commitlog}'s record schema (bench/spark_bench.py checks they are equal on its warm-up store) as
 * Spark's own columnar batches, with Spark's column pruning ({@code prune=false} fills every column anyway).
 * Splits are planned in the driver at record boundaries, about {@code splitSize} bytes each.
 */
public class CommitLogPrototype implements TableProvider {
  static final StructType SCHEMA = new StructType()
      .add("segment", DataTypes.StringType).add("file_position", DataTypes.LongType)
      .add("physical_offset", DataTypes.LongType).add("total_size", DataTypes.LongType)
      .add("magic", DataTypes.LongType).add("body_crc", DataTypes.IntegerType)
      .add("crc_ok", DataTypes.BooleanType).add("queue_id", DataTypes.IntegerType)
      .add("flag", DataTypes.IntegerType).add("queue_offset", DataTypes.LongType)
      .add("sys_flag", DataTypes.IntegerType).add("born_timestamp", DataTypes.LongType)
      .add("born_host", DataTypes.StringType).add("store_timestamp", DataTypes.LongType)
      .add("store_host", DataTypes.StringType).add("reconsume_times", DataTypes.IntegerType)
      .add("prepared_transaction_offset", DataTypes.LongType).add("topic", DataTypes.StringType)
      .add("properties", DataTypes.createMapType(DataTypes.StringType, DataTypes.StringType))
      .add("keys", DataTypes.StringType).add("tags", DataTypes.StringType)
      .add("body_size", DataTypes.IntegerType).add("msg_id", DataTypes.StringType)
      .add("body", DataTypes.BinaryType).add("malformed", DataTypes.BooleanType)
      .add("error", DataTypes.StringType);

  @Override public StructType inferSchema(CaseInsensitiveStringMap options) { return SCHEMA; }

  @Override public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> props) {
    return new T(props);
  }

  static class T implements Table, SupportsRead {
    final Map<String, String> props;
    T(Map<String, String> props) { this.props = props; }
    public String name() { return "trimq-commitlog-jvm-prototype"; }
    public StructType schema() { return SCHEMA; }
    public Set<TableCapability> capabilities() { return EnumSet.of(TableCapability.BATCH_READ); }
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) { return new SB(options); }
  }

  static class SB implements ScanBuilder, SupportsPushDownRequiredColumns, Scan, Batch {
    final CaseInsensitiveStringMap options;
    StructType required = SCHEMA;
    SB(CaseInsensitiveStringMap options) { this.options = options; }
    public void pruneColumns(StructType s) {
      if (!"false".equals(options.get("prune"))) required = s;
    }
    public Scan build() { return this; }
    public StructType readSchema() { return required; }
    public Batch toBatch() { return this; }

    public InputPartition[] planInputPartitions() {
      File dir = new File(options.get("path"), "commitlog");
      File[] files = dir.listFiles();
      Arrays.sort(files);
      long split = Long.parseLong(options.getOrDefault("splitSize", "67108864"));
      List<InputPartition> out = new ArrayList<>();
      for (File f : files) {
        try (RandomAccessFile raf = new RandomAccessFile(f, "r"); FileChannel ch = raf.getChannel()) {
          ByteBuffer b = ch.map(FileChannel.MapMode.READ_ONLY, 0, ch.size());
          long pos = 0, start = 0, n = ch.size();
          while (pos + 8 <= n) {
            int size = b.getInt((int) pos);
            int magic = b.getInt((int) pos + 4);
            if (magic == 0xcbd43194 || (size == 0 && magic == 0)) break;  // the filler or the unwritten tail
            if (size < 88 || magic != 0xdaa320a7 || pos + size > n)
              throw new IllegalStateException(f + ": not a clean record at " + pos + " (the prototype reads clean stores only)");
            if (pos - start >= split) { out.add(new P(f.getPath(), start, pos, Long.parseLong(f.getName()))); start = pos; }
            pos += size;
          }
          if (pos > start) out.add(new P(f.getPath(), start, pos, Long.parseLong(f.getName())));
        } catch (IOException e) { throw new RuntimeException(e); }
      }
      return out.toArray(new InputPartition[0]);
    }

    public PartitionReaderFactory createReaderFactory() { return new F(required); }
  }

  static class P implements InputPartition, Serializable {
    final String path; final long start, end, base;
    P(String path, long start, long end, long base) { this.path = path; this.start = start; this.end = end; this.base = base; }
  }

  static class F implements PartitionReaderFactory {
    final StructType required;
    F(StructType required) { this.required = required; }
    public PartitionReader<org.apache.spark.sql.catalyst.InternalRow> createReader(InputPartition p) {
      throw new UnsupportedOperationException("columnar only");
    }
    public boolean supportColumnarReads(InputPartition p) { return true; }
    public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition p) { return new R((P) p, required); }
  }

  static final int BATCH = 4096;

  static class R implements PartitionReader<ColumnarBatch> {
    final P p; final byte[] a; final ByteBuffer b; final int[] col; final OnHeapColumnVector[] v; final ColumnarBatch batch;
    final byte[] segName; int pos; final int end; final CRC32 crc = new CRC32();
    R(P p, StructType required) {
      this.p = p;
      try (RandomAccessFile raf = new RandomAccessFile(p.path, "r"); FileChannel ch = raf.getChannel()) {
        a = new byte[(int) (p.end - p.start)];
        ByteBuffer bb = ByteBuffer.wrap(a);
        while (bb.hasRemaining()) { if (ch.read(bb, p.start + bb.position()) < 0) break; }
      } catch (IOException e) { throw new RuntimeException(e); }
      b = ByteBuffer.wrap(a);
      end = a.length;
      String[] names = required.fieldNames();
      col = new int[names.length];
      for (int i = 0; i < names.length; i++) col[i] = SCHEMA.fieldIndex(names[i]);
      v = OnHeapColumnVector.allocateColumns(BATCH, required);
      batch = new ColumnarBatch(v);
      segName = new File(p.path).getName().getBytes(StandardCharsets.UTF_8);
    }

    public boolean next() {
      if (pos >= end) return false;
      for (OnHeapColumnVector c : v) c.reset();
      int n = 0;
      while (n < BATCH && pos < end) { row(n++); }
      batch.setNumRows(n);
      return true;
    }

    private static final byte[] HEX = "0123456789ABCDEF".getBytes(StandardCharsets.US_ASCII);
    private final byte[] tmp = new byte[64];

    private int host(int off) {
      int k = 0;
      for (int i = 0; i < 4; i++) {
        int x = a[off + i] & 0xff;
        if (i > 0) tmp[k++] = '.';
        k = dec(x, k);
      }
      tmp[k++] = ':';
      return dec(b.getInt(off + 4), k);
    }

    private int dec(int x, int k) {
      if (x == 0) { tmp[k++] = '0'; return k; }
      int s = k; while (x > 0) { tmp[k++] = (byte) ('0' + x % 10); x /= 10; }
      for (int i = s, j = k - 1; i < j; i++, j--) { byte t = tmp[i]; tmp[i] = tmp[j]; tmp[j] = t; }
      return k;
    }

    private void row(int r) {
      int o = pos;
      int size = b.getInt(o);
      int bodyLen = b.getInt(o + 84);
      int b0 = o + 88, b1 = b0 + bodyLen;
      int tlen = a[b1] & 0xff;
      int t1 = b1 + 1 + tlen;
      int plen = b.getShort(t1);
      int p0 = t1 + 2, p1 = p0 + plen;
      long phys = b.getLong(o + 28);
      if ((b.getInt(o + 36) & 0x30) != 0 || p1 != o + size || bodyLen < 0)
        throw new IllegalStateException(p.path + ": record at " + (p.start + o) + " has IPv6 hosts or bad field lengths "
            + "(the prototype reads clean IPv4 records only)");
      for (int i = 0; i < col.length; i++) {
        OnHeapColumnVector c = v[i];
        switch (col[i]) {
          case 0: c.putByteArray(r, segName, 0, segName.length); break;
          case 1: c.putLong(r, p.start + o); break;
          case 2: c.putLong(r, phys); break;
          case 3: c.putLong(r, size); break;
          case 4: c.putLong(r, b.getInt(o + 4) & 0xffffffffL); break;
          case 5: c.putInt(r, b.getInt(o + 8)); break;
          case 6: { crc.reset(); crc.update(a, b0, bodyLen);
                    c.putBoolean(r, (int) (crc.getValue() & 0x7FFFFFFF) == b.getInt(o + 8)); break; }
          case 7: c.putInt(r, b.getInt(o + 12)); break;
          case 8: c.putInt(r, b.getInt(o + 16)); break;
          case 9: c.putLong(r, b.getLong(o + 20)); break;
          case 10: c.putInt(r, b.getInt(o + 36)); break;
          case 11: c.putLong(r, b.getLong(o + 40)); break;
          case 12: { int k = host(o + 48); c.putByteArray(r, tmp, 0, k); break; }
          case 13: c.putLong(r, b.getLong(o + 56)); break;
          case 14: { int k = host(o + 64); c.putByteArray(r, tmp, 0, k); break; }
          case 15: c.putInt(r, b.getInt(o + 72)); break;
          case 16: c.putLong(r, b.getLong(o + 76)); break;
          case 17: c.putByteArray(r, a, b1 + 1, tlen); break;
          case 18: props(c, r, p0, p1); break;
          case 19: prop(c, r, p0, p1, KEYS); break;
          case 20: prop(c, r, p0, p1, TAGS); break;
          case 21: c.putInt(r, bodyLen); break;
          case 22: {
            int k = 0;
            for (int j = 0; j < 8; j++) { int x = a[o + 64 + j] & 0xff; tmp[k++] = HEX[x >> 4]; tmp[k++] = HEX[x & 15]; }
            for (int j = 56; j >= 0; j -= 8) { int x = (int) (phys >>> j) & 0xff; tmp[k++] = HEX[x >> 4]; tmp[k++] = HEX[x & 15]; }
            c.putByteArray(r, tmp, 0, k); break;
          }
          case 23: c.putNull(r); break;
          case 24: c.putBoolean(r, false); break;
          case 25: c.putNull(r); break;
          default: throw new IllegalStateException();
        }
      }
      pos += size;
    }

    static final byte[] KEYS = "KEYS".getBytes(StandardCharsets.US_ASCII);
    static final byte[] TAGS = "TAGS".getBytes(StandardCharsets.US_ASCII);

    private void prop(OnHeapColumnVector c, int r, int p0, int p1, byte[] name) {
      int s = p0;
      while (s < p1) {
        int e = s; while (e < p1 && a[e] != 2) e++;
        int m = s; while (m < e && a[m] != 1) m++;
        if (m < e && m - s == name.length && Arrays.equals(a, s, m, name, 0, name.length)) {
          c.putByteArray(r, a, m + 1, e - m - 1); return;
        }
        s = e + 1;
      }
      c.putNull(r);
    }

    private void props(OnHeapColumnVector c, int r, int p0, int p1) {
      WritableColumnVector ks = c.getChild(0), vs = c.getChild(1);
      int first = ks.getElementsAppended();
      int s = p0, n = 0;
      while (s < p1) {
        int e = s; while (e < p1 && a[e] != 2) e++;
        int m = s; while (m < e && a[m] != 1) m++;
        if (m < e) { ks.appendByteArray(a, s, m - s); vs.appendByteArray(a, m + 1, e - m - 1); n++; }
        s = e + 1;
      }
      c.putArray(r, first, n);
    }

    public ColumnarBatch get() { return batch; }
    public void close() { batch.close(); }
  }
}
