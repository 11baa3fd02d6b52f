package org.trimq.spark;

import java.io.File;
import java.io.IOException;
import java.io.RandomAccessFile;
import java.io.Serializable;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.EnumSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.zip.CRC32;

import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.api.java.function.Function;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.InternalRow;
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
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.execution.vectorized.OnHeapColumnVector;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * The commit log's clean segments read in the JVM (spark_jobs/jvm_reader.py puts it together with the Python data
 * source, which reads every other segment).
 *
 * <p>A segment is clean when every record in it is a message of IPv4 hosts that the Python readers take as a
 * regular record (magic, size within bounds, field lengths adding up, topic and properties well-formed UTF-8, no
 * property named twice) and the records end in the end-of-file filler, in zeros up to the end, or at the end:
 * {@link #scanSegments} decides that in the executors and plans the splits of the clean segments at record
 * boundaries. For those the rows equal the Python readers' row for row (tests/spark/test_jvm_reader.py), and
 * Spark reads them as its own columnar batches, with its column pruning. A record whose structure is not what the
 * scan found (the file changed in between) is an error, never a guess; the readers do not check the text again.
 */
public class CommitLogSource implements TableProvider {
  static final int MESSAGE_MAGIC = 0xDAA320A7;
  static final int BLANK_MAGIC = 0xCBD43194;
  static final int MIN_RECORD_SIZE = 91;
  static final int V4_HEADER = 88;
  static final int END_FILE_MIN_BLANK_LENGTH = 8;

  /** The record schema of spark_jobs/commitlog_source.py RECORD_SCHEMA, column for column. */
  public static final StructType SCHEMA = new StructType()
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

  // ------------------------------------------------------------------ the scan: which segments are clean

  /**
   * Scan the segments ({@code paths}, newline-separated) in the executors, a segment per task. Returns a line per
   * segment, in order: {@code "-"} when it is not clean, else the record-boundary offsets that cut it into splits of
   * about {@code splitSize} bytes, space-separated, from 0 to where its records end.
   */
  public static String scanSegments(SparkSession spark, String paths, long maxRecordSize, long splitSize) {
    List<String> files = Arrays.asList(paths.split("\n"));
    JavaSparkContext jsc = JavaSparkContext.fromSparkContext(spark.sparkContext());
    List<String> lines = jsc.parallelize(files, Math.max(1, files.size()))
        .map(new ScanTask(maxRecordSize, splitSize)).collect();
    return String.join("\n", lines);
  }

  static final class ScanTask implements Function<String, String> {
    private static final long serialVersionUID = 1L;
    private final long maxRecordSize;
    private final long splitSize;

    ScanTask(long maxRecordSize, long splitSize) {
      this.maxRecordSize = maxRecordSize;
      this.splitSize = splitSize;
    }

    @Override
    public String call(String path) throws IOException {
      long[] cuts = scan(path, maxRecordSize, splitSize);
      if (cuts == null) return "-";
      StringBuilder sb = new StringBuilder();
      for (long c : cuts) sb.append(sb.length() == 0 ? "" : " ").append(c);
      return sb.toString();
    }
  }

  /** The split cuts of a clean segment (see {@link #scanSegments}); null when it is not clean. */
  public static long[] scan(String path, long maxRecordSize, long splitSize) throws IOException {
    File f = new File(path);
    try (RandomAccessFile raf = new RandomAccessFile(f, "r"); FileChannel ch = raf.getChannel()) {
      long n = ch.size();
      if (n > Integer.MAX_VALUE) return null;
      ByteBuffer b = ch.map(FileChannel.MapMode.READ_ONLY, 0, n);
      List<Long> cuts = new ArrayList<>();
      cuts.add(0L);
      int pos = 0;
      long lastCut = 0;
      while (pos < n) {
        if (pos + 8 > n) return null;
        int size = b.getInt(pos);
        int magic = b.getInt(pos + 4);
        if (magic == BLANK_MAGIC) {
          if (size < END_FILE_MIN_BLANK_LENGTH || pos + (long) size != n) return null;
          break;
        }
        if (size == 0 && magic == 0) {
          if (!zerosFrom(b, pos, (int) n)) return null;
          break;
        }
        if (!regular(b, pos, size, n, maxRecordSize)) return null;
        if (pos - lastCut >= splitSize) {
          cuts.add((long) pos);
          lastCut = pos;
        }
        pos += size;
      }
      if (pos > lastCut) cuts.add((long) pos);
      long[] out = new long[cuts.size()];
      for (int i = 0; i < out.length; i++) out[i] = cuts.get(i);
      return out;
    }
  }

  private static boolean zerosFrom(ByteBuffer b, int pos, int n) {
    int i = pos;
    for (; i + 8 <= n; i += 8) if (b.getLong(i) != 0) return false;
    for (; i < n; i++) if (b.get(i) != 0) return false;
    return true;
  }

  /** Whether the record at {@code pos} is one the Python readers take as regular, of IPv4 hosts. */
  static boolean regular(ByteBuffer b, int pos, int size, long n, long maxRecordSize) {
    int t1 = topicEnd(b, pos, size, n, maxRecordSize);
    if (t1 < 0) return false;
    int topic = pos + V4_HEADER + b.getInt(pos + 84) + 1;
    int end = pos + size;
    return utf8(topic, t1, b) && utf8(t1 + 2, end, b) && distinctNames(b, t1 + 2, end);
  }

  /**
   * Where the topic of the record at {@code pos} ends (its properties' length starts) when the record is a message of
   * IPv4 hosts whose field lengths add up within {@code n}; -1 otherwise. The readers check this again for every record,
   * because it bounds every read they make; the text checks of {@link #regular} are the scan's alone.
   */
  static int topicEnd(ByteBuffer b, int pos, int size, long n, long maxRecordSize) {
    if (b.getInt(pos + 4) != MESSAGE_MAGIC || size < MIN_RECORD_SIZE || size > maxRecordSize || pos + (long) size > n) {
      return -1;
    }
    int end = pos + size;
    if ((b.getInt(pos + 36) & 0x30) != 0) return -1;  // IPv6 hosts: the Python reader formats those
    int bodyLen = b.getInt(pos + 84);
    long b1 = (long) pos + V4_HEADER + bodyLen;
    if (bodyLen < 0 || b1 + 3 > end) return -1;
    int t1 = (int) b1 + 1 + (b.get((int) b1) & 0xff);
    if (t1 + 2 > end) return -1;
    int plen = b.getShort(t1);
    return plen < 0 || t1 + 2 + plen != end ? -1 : t1;
  }

  /** Well-formed UTF-8 (Unicode's table 3-7: no overlong forms, no surrogates, nothing above U+10FFFF). */
  static boolean utf8(int s, int e, ByteBuffer b) {
    int i = s;
    while (i < e) {
      int c = b.get(i) & 0xff;
      if (c < 0x80) {
        i++;
        continue;
      }
      int more;
      int lo = 0x80;
      int hi = 0xBF;
      if (c >= 0xC2 && c <= 0xDF) {
        more = 1;
      } else if (c == 0xE0) {
        more = 2;
        lo = 0xA0;
      } else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) {
        more = 2;
      } else if (c == 0xED) {
        more = 2;
        hi = 0x9F;
      } else if (c == 0xF0) {
        more = 3;
        lo = 0x90;
      } else if (c >= 0xF1 && c <= 0xF3) {
        more = 3;
      } else if (c == 0xF4) {
        more = 3;
        hi = 0x8F;
      } else {
        return false;
      }
      if (i + more >= e) return false;
      int d = b.get(i + 1) & 0xff;
      if (d < lo || d > hi) return false;
      for (int k = 2; k <= more; k++) {
        int x = b.get(i + k) & 0xff;
        if (x < 0x80 || x > 0xBF) return false;
      }
      i += more + 1;
    }
    return true;
  }

  /** No property named twice (the Python readers keep the last; the map here would keep both). */
  static boolean distinctNames(ByteBuffer b, int p0, int p1) {
    int[] starts = new int[8];
    int[] lens = new int[8];
    int count = 0;
    int s = p0;
    while (s < p1) {
      int e = s;
      while (e < p1 && b.get(e) != 2) e++;
      int m = s;
      while (m < e && b.get(m) != 1) m++;
      if (m < e) {
        for (int j = 0; j < count; j++) {
          if (lens[j] == m - s && sameBytes(b, starts[j], s, m - s)) return false;
        }
        if (count == starts.length) {
          starts = Arrays.copyOf(starts, count * 2);
          lens = Arrays.copyOf(lens, count * 2);
        }
        starts[count] = s;
        lens[count++] = m - s;
      }
      s = e + 1;
    }
    return true;
  }

  private static boolean sameBytes(ByteBuffer b, int x, int y, int length) {
    for (int k = 0; k < length; k++) {
      if (b.get(x + k) != b.get(y + k)) return false;
    }
    return true;
  }

  // ------------------------------------------------------------------ the source

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    return SCHEMA;
  }

  @Override
  public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
    return new CommitLogTable();
  }

  static final class CommitLogTable implements Table, SupportsRead {
    @Override
    public String name() {
      return "trimq-commitlog-jvm";
    }

    @Override
    @SuppressWarnings("deprecation")  // Spark 4 still asks a Table for its schema
    public StructType schema() {
      return SCHEMA;
    }

    @Override
    public Set<TableCapability> capabilities() {
      return EnumSet.of(TableCapability.BATCH_READ);
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
      return new CommitLogScan(options);
    }
  }

  /** Options: {@code splits} (lines of "path start end", what {@link #scanSegments} planned), {@code includeBody},
   * {@code maxRecordSize}, {@code pruneColumns} ({@code false}: fill every column whatever Spark reads, to measure
   * the reader itself). */
  static final class CommitLogScan implements ScanBuilder, SupportsPushDownRequiredColumns, Scan, Batch {
    private final CaseInsensitiveStringMap options;
    private StructType required = SCHEMA;

    CommitLogScan(CaseInsensitiveStringMap options) {
      this.options = options;
    }

    @Override
    public void pruneColumns(StructType requiredSchema) {
      if (!"false".equalsIgnoreCase(options.getOrDefault("pruneColumns", "true"))) required = requiredSchema;
    }

    @Override
    public Scan build() {
      return this;
    }

    @Override
    public StructType readSchema() {
      return required;
    }

    @Override
    public Batch toBatch() {
      return this;
    }

    @Override
    public InputPartition[] planInputPartitions() {
      List<InputPartition> out = new ArrayList<>();
      String splits = options.getOrDefault("splits", "");
      for (String line : splits.split("\n")) {
        if (line.isEmpty()) continue;
        int a = line.lastIndexOf(' ', line.lastIndexOf(' ') - 1);
        String[] range = line.substring(a + 1).split(" ");
        out.add(new SplitRange(line.substring(0, a), Long.parseLong(range[0]), Long.parseLong(range[1])));
      }
      return out.toArray(new InputPartition[0]);
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
      return new ReaderFactory(required, "true".equalsIgnoreCase(options.getOrDefault("includeBody", "false")),
          Long.parseLong(options.getOrDefault("maxRecordSize", String.valueOf(Long.MAX_VALUE))));
    }
  }

  static final class SplitRange implements InputPartition, Serializable {
    private static final long serialVersionUID = 1L;
    final String path;
    final long start;
    final long end;

    SplitRange(String path, long start, long end) {
      this.path = path;
      this.start = start;
      this.end = end;
    }
  }

  static final class ReaderFactory implements PartitionReaderFactory {
    private static final long serialVersionUID = 1L;
    private final StructType required;
    private final boolean includeBody;
    private final long maxRecordSize;

    ReaderFactory(StructType required, boolean includeBody, long maxRecordSize) {
      this.required = required;
      this.includeBody = includeBody;
      this.maxRecordSize = maxRecordSize;
    }

    @Override
    public PartitionReader<InternalRow> createReader(InputPartition partition) {
      throw new UnsupportedOperationException("trimq-commitlog-jvm reads columnar batches only");
    }

    @Override
    public boolean supportColumnarReads(InputPartition partition) {
      return true;
    }

    @Override
    public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
      return new SplitReader((SplitRange) partition, required, includeBody, maxRecordSize);
    }
  }

  static final int BATCH_ROWS = 4096;
  static final int HOST_SLOTS = 64;
  private static final byte[] HEX = "0123456789ABCDEF".getBytes(StandardCharsets.US_ASCII);
  private static final byte[] KEYS = "KEYS".getBytes(StandardCharsets.US_ASCII);
  private static final byte[] TAGS = "TAGS".getBytes(StandardCharsets.US_ASCII);

  /** Reads one split of a clean segment into batches of the required columns. */
  static final class SplitReader implements PartitionReader<ColumnarBatch> {
    private final SplitRange split;
    private final byte[] data;
    private final ByteBuffer buf;
    private final int[] columns;
    private final OnHeapColumnVector[] vectors;
    private final ColumnarBatch batch;
    private final byte[] segment;
    private final boolean includeBody;
    private final long maxRecordSize;
    private final CRC32 crc = new CRC32();
    private final byte[] text = new byte[64];
    private final long[] hostRaw = new long[HOST_SLOTS];
    private final byte[][] hostText = new byte[HOST_SLOTS][];
    private int pos;

    SplitReader(SplitRange split, StructType required, boolean includeBody, long maxRecordSize) {
      this.split = split;
      this.includeBody = includeBody;
      this.maxRecordSize = maxRecordSize;
      File f = new File(split.path);
      segment = f.getName().getBytes(StandardCharsets.UTF_8);
      data = new byte[(int) (split.end - split.start)];
      try (RandomAccessFile raf = new RandomAccessFile(f, "r"); FileChannel ch = raf.getChannel()) {
        ByteBuffer into = ByteBuffer.wrap(data);
        while (into.hasRemaining()) {
          if (ch.read(into, split.start + into.position()) < 0) {
            throw new IllegalStateException(split.path + " ends before " + split.end + ": it changed since the scan");
          }
        }
      } catch (IOException e) {
        throw new IllegalStateException(split.path + ": " + e.getMessage(), e);
      }
      buf = ByteBuffer.wrap(data);
      String[] names = required.fieldNames();
      columns = new int[names.length];
      for (int i = 0; i < names.length; i++) columns[i] = SCHEMA.fieldIndex(names[i]);
      vectors = OnHeapColumnVector.allocateColumns(BATCH_ROWS, required);
      batch = new ColumnarBatch(vectors);
    }

    @Override
    public boolean next() {
      if (pos >= data.length) return false;
      for (OnHeapColumnVector v : vectors) v.reset();
      int rows = 0;
      while (rows < BATCH_ROWS && pos < data.length) {
        if (pos + 8 > data.length || topicEnd(buf, pos, buf.getInt(pos), data.length, maxRecordSize) < 0) {
          throw new IllegalStateException(split.path + ": the record at " + (split.start + pos)
              + " is not the regular record the scan found there (the segment changed since the scan)");
        }
        int size = buf.getInt(pos);
        row(rows++, size);
        pos += size;
      }
      batch.setNumRows(rows);
      return true;
    }

    private int decimal(long x, int k) {
      String s = Long.toString(x);
      for (int i = 0; i < s.length(); i++) text[k++] = (byte) s.charAt(i);
      return k;
    }

    /** "a.b.c.d:port" for the 8 host bytes at {@code off}, as the Python readers' socket.inet_ntop + the signed
     * port; formatted once per distinct host (a store has few), kept in a small direct-mapped table. */
    private byte[] host(int off) {
      long raw = buf.getLong(off);
      int slot = (int) (raw ^ (raw >>> 29) ^ (raw >>> 47)) & (HOST_SLOTS - 1);
      byte[] known = hostText[slot];
      if (known != null && hostRaw[slot] == raw) return known;
      int k = 0;
      for (int i = 0; i < 4; i++) {
        if (i > 0) text[k++] = '.';
        k = decimal(data[off + i] & 0xff, k);
      }
      text[k++] = ':';
      k = decimal(buf.getInt(off + 4), k);
      hostRaw[slot] = raw;
      return hostText[slot] = Arrays.copyOf(text, k);
    }

    private void row(int r, int size) {
      int o = pos;
      int bodyLen = buf.getInt(o + 84);
      int b0 = o + V4_HEADER;
      int b1 = b0 + bodyLen;
      int tlen = data[b1] & 0xff;
      int t1 = b1 + 1 + tlen;
      int p0 = t1 + 2;
      int p1 = o + size;
      long phys = buf.getLong(o + 28);
      for (int i = 0; i < columns.length; i++) {
        OnHeapColumnVector c = vectors[i];
        switch (columns[i]) {
          case 0: c.putByteArray(r, segment, 0, segment.length); break;
          case 1: c.putLong(r, split.start + o); break;
          case 2: c.putLong(r, phys); break;
          case 3: c.putLong(r, size); break;
          case 4: c.putLong(r, buf.getInt(o + 4) & 0xFFFFFFFFL); break;
          case 5: c.putInt(r, buf.getInt(o + 8)); break;
          case 6:
            crc.reset();
            crc.update(data, b0, bodyLen);
            c.putBoolean(r, (int) (crc.getValue() & 0x7FFFFFFF) == buf.getInt(o + 8));
            break;
          case 7: c.putInt(r, buf.getInt(o + 12)); break;
          case 8: c.putInt(r, buf.getInt(o + 16)); break;
          case 9: c.putLong(r, buf.getLong(o + 20)); break;
          case 10: c.putInt(r, buf.getInt(o + 36)); break;
          case 11: c.putLong(r, buf.getLong(o + 40)); break;
          case 12: putBytes(c, r, host(o + 48)); break;
          case 13: c.putLong(r, buf.getLong(o + 56)); break;
          case 14: putBytes(c, r, host(o + 64)); break;
          case 15: c.putInt(r, buf.getInt(o + 72)); break;
          case 16: c.putLong(r, buf.getLong(o + 76)); break;
          case 17: c.putByteArray(r, data, b1 + 1, tlen); break;
          case 18: properties(c, r, p0, p1); break;
          case 19: property(c, r, p0, p1, KEYS); break;
          case 20: property(c, r, p0, p1, TAGS); break;
          case 21: c.putInt(r, bodyLen); break;
          case 22: {
            int k = 0;
            for (int j = 0; j < 8; j++) {
              int x = data[o + 64 + j] & 0xff;
              text[k++] = HEX[x >> 4];
              text[k++] = HEX[x & 15];
            }
            for (int j = 56; j >= 0; j -= 8) {
              int x = (int) (phys >>> j) & 0xff;
              text[k++] = HEX[x >> 4];
              text[k++] = HEX[x & 15];
            }
            c.putByteArray(r, text, 0, k);
            break;
          }
          case 23:
            if (includeBody) c.putByteArray(r, data, b0, bodyLen);
            else c.putNull(r);
            break;
          case 24: c.putBoolean(r, false); break;
          case 25: c.putNull(r); break;
          default: throw new IllegalStateException("no column " + columns[i]);
        }
      }
    }

    /** Where the property item starting at {@code s} ends (its separator 2, or {@code p1}). */
    private int itemEnd(int s, int p1) {
      int e = s;
      while (e < p1 && data[e] != 2) e++;
      return e;
    }

    /** Where the name of the item {@code [s, e)} ends (its separator 1; {@code e}: no value, the item is skipped). */
    private int nameEnd(int s, int e) {
      int m = s;
      while (m < e && data[m] != 1) m++;
      return m;
    }

    private static void putBytes(OnHeapColumnVector c, int r, byte[] bytes) {
      c.putByteArray(r, bytes, 0, bytes.length);
    }

    private void property(OnHeapColumnVector c, int r, int p0, int p1, byte[] name) {
      int s = p0;
      while (s < p1) {
        int e = itemEnd(s, p1);
        int m = nameEnd(s, e);
        if (m < e && m - s == name.length && Arrays.equals(data, s, m, name, 0, name.length)) {
          c.putByteArray(r, data, m + 1, e - m - 1);
          return;
        }
        s = e + 1;
      }
      c.putNull(r);
    }

    private void properties(OnHeapColumnVector c, int r, int p0, int p1) {
      WritableColumnVector names = c.getChild(0);
      WritableColumnVector values = c.getChild(1);
      int first = names.getElementsAppended();
      int count = 0;
      int s = p0;
      while (s < p1) {
        int e = itemEnd(s, p1);
        int m = nameEnd(s, e);
        if (m < e) {
          names.appendByteArray(data, s, m - s);
          values.appendByteArray(data, m + 1, e - m - 1);
          count++;
        }
        s = e + 1;
      }
      c.putArray(r, first, count);
    }

    @Override
    public ColumnarBatch get() {
      return batch;
    }

    @Override
    public void close() {
      batch.close();
    }
  }
}
