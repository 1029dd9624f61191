package icecdc.eqdel;

import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.ObjectInputStream;
import java.io.ObjectOutputStream;
import java.io.Serializable;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.UUID;

import org.apache.iceberg.DataFile;
import org.apache.iceberg.DeleteFile;
import org.apache.iceberg.FileContent;
import org.apache.iceberg.FileFormat;
import org.apache.iceberg.ManifestFile;
import org.apache.iceberg.ManifestFiles;
import org.apache.iceberg.ManifestReader;
import org.apache.iceberg.RewriteFiles;
import org.apache.iceberg.Snapshot;
import org.apache.iceberg.PartitionKey;
import org.apache.iceberg.PartitionSpec;
import org.apache.iceberg.RowDelta;
import org.apache.iceberg.Schema;
import org.apache.iceberg.SortOrder;
import org.apache.iceberg.StructLike;
import org.apache.iceberg.Table;
import org.apache.iceberg.TableProperties;
import org.apache.iceberg.avro.Avro;
import org.apache.iceberg.data.BaseFileWriterFactory;
import org.apache.iceberg.io.FanoutDataWriter;
import org.apache.iceberg.io.OutputFileFactory;
import org.apache.iceberg.io.RollingEqualityDeleteWriter;
import org.apache.iceberg.orc.ORC;
import org.apache.iceberg.parquet.Parquet;
import org.apache.iceberg.spark.Spark3Util;
import org.apache.iceberg.spark.data.SparkParquetWriters;
import org.apache.iceberg.spark.source.SerializableTableWithSize;
import org.apache.iceberg.types.Type;
import org.apache.iceberg.util.PropertyUtil;
import org.apache.iceberg.util.StructLikeMap;
import org.apache.spark.TaskContext;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.api.java.function.FlatMapFunction;
import org.apache.spark.broadcast.Broadcast;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.execution.QueryExecution;
import org.apache.spark.sql.execution.SQLExecution$;
import scala.Function0;
import scala.Option;
import scala.runtime.AbstractFunction0;

/**
 * One upsert batch as an Iceberg row delta: data files of the batch's last images plus equality-delete
 * files on the identifier columns, written by the executors with Iceberg's own Parquet writers, then
 * committed as ONE row-delta snapshot (with the caller's summary properties) on a branch.
 *
 * <p>The rows: the table's columns in table order, then a boolean "is delete" column. Every row's key goes
 * to the equality-delete file (so the key's previous image, in an older snapshot, is deleted); a row that is
 * not a delete also becomes a data row. Equality deletes apply only to data files of a LOWER sequence number,
 * so the rows added by the same commit survive. Partitioned tables: every partition source column must be
 * an identifier column (the caller checks), so a key's old and new image share their partition.
 */
public final class EqualityDeltaWriter {

  /**
   * Writes the files of a row delta, not committed: {@link #commit} or {@link #abort} it. The write is one SQL
   * execution of {@code rows}' query, so what the query observes (Spark's {@code Observation}) reaches its
   * listeners when this returns, before the caller decides between the two.
   */
  public Pending writeFiles(Dataset<Row> rows, String tableName, List<String> keyColumns) throws Exception {
    SparkSession spark = rows.sparkSession();
    Table table = Spark3Util.loadIcebergTable(spark, tableName);
    Schema schema = table.schema();
    int[] equalityIds = new int[keyColumns.size()];
    int[] keyOrdinals = new int[keyColumns.size()];
    List<String> columns = new ArrayList<>();
    for (StructField f : rows.schema().fields()) {
      columns.add(f.name());
    }
    for (int i = 0; i < keyColumns.size(); i++) {
      equalityIds[i] = schema.findField(keyColumns.get(i)).fieldId();
      keyOrdinals[i] = columns.indexOf(keyColumns.get(i));
    }
    Broadcast<Table> shared = JavaSparkContext.fromSparkContext(spark.sparkContext())
        .broadcast(SerializableTableWithSize.copyOf(table));
    Task task = new Task(shared, rows.schema(), equalityIds, keyOrdinals, columns.size() - 1,
        UUID.randomUUID().toString());
    QueryExecution query = rows.queryExecution();
    Function0<List<byte[]>> run = new AbstractFunction0<List<byte[]>>() {
      @Override
      public List<byte[]> apply() {
        return query.toRdd().toJavaRDD().mapPartitions(task).collect();
      }
    };
    List<byte[]> parts = SQLExecution$.MODULE$.withNewExecutionId(query, Option.apply("icecdc equality delta"), run);
    shared.destroy();
    Pending pending = new Pending(table);
    for (byte[] part : parts) {
      Object[] files = (Object[]) deserialize(part);
      for (Object file : (List<?>) files[0]) {
        pending.dataFiles.add((DataFile) file);
      }
      for (Object file : (List<?>) files[1]) {
        pending.deleteFiles.add((DeleteFile) file);
      }
    }
    return pending;
  }

  /**
   * Commits written files as ONE row delta on {@code branch}; returns "dataFiles,deleteFiles,dataRecords,
   * deleteRecords" (no files: no commit).
   */
  public String commit(Pending pending, String branch, Map<String, String> summary) {
    long dataRecords = pending.dataFiles.stream().mapToLong(DataFile::recordCount).sum();
    long deleteRecords = pending.deleteFiles.stream().mapToLong(DeleteFile::recordCount).sum();
    if (!pending.dataFiles.isEmpty() || !pending.deleteFiles.isEmpty()) {
      RowDelta delta = pending.table.newRowDelta().toBranch(branch);
      pending.dataFiles.forEach(delta::addRows);
      pending.deleteFiles.forEach(delta::addDeletes);
      summary.forEach(delta::set);
      delta.commit();
    }
    return pending.dataFiles.size() + "," + pending.deleteFiles.size() + "," + dataRecords + "," + deleteRecords;
  }

  /** Deletes written files that will not be committed (no snapshot names them); returns how many. */
  public int abort(Pending pending) {
    int n = 0;
    for (DataFile file : pending.dataFiles) {
      pending.table.io().deleteFile(file.location());
      n++;
    }
    for (DeleteFile file : pending.deleteFiles) {
      pending.table.io().deleteFile(file.location());
      n++;
    }
    return n;
  }

  /** Files written by {@link #writeFiles}, not committed yet. */
  public static final class Pending {
    private final Table table;
    private final List<DataFile> dataFiles = new ArrayList<>();
    private final List<DeleteFile> deleteFiles = new ArrayList<>();

    Pending(Table table) {
      this.table = table;
    }
  }

  /**
   * Removes the equality-delete files no live data file can see any more (data sequence number at or
   * below that of every live data file of its partition; an unpartitioned delete: of the table), in one
   * rewrite commit. A compaction leaves them behind; readers that refuse equality deletes (pyiceberg)
   * then read the table. Returns how many were removed.
   */
  public int dropDanglingEqualityDeletes(SparkSession spark, String tableName) throws Exception {
    Table table = Spark3Util.loadIcebergTable(spark, tableName);
    Snapshot snapshot = table.currentSnapshot();
    if (snapshot == null) {
      return 0;
    }
    Map<Integer, PartitionSpec> specs = table.specs();
    Map<Integer, StructLikeMap<Long>> minSeq = new HashMap<>();
    long tableMin = Long.MAX_VALUE;
    for (ManifestFile manifest : snapshot.dataManifests(table.io())) {
      try (ManifestReader<DataFile> reader = ManifestFiles.read(manifest, table.io(), specs)) {
        for (DataFile file : reader) {
          long seq = file.dataSequenceNumber();
          tableMin = Math.min(tableMin, seq);
          StructLikeMap<Long> bySpec = minSeq.computeIfAbsent(file.specId(),
              id -> StructLikeMap.create(specs.get(id).partitionType()));
          Long prior = bySpec.get(file.partition());
          if (prior == null || seq < prior) {
            bySpec.put(file.partition(), seq);
          }
        }
      }
    }
    List<DeleteFile> dangling = new ArrayList<>();
    for (ManifestFile manifest : snapshot.deleteManifests(table.io())) {
      try (ManifestReader<DeleteFile> reader = ManifestFiles.readDeleteManifest(manifest, table.io(), specs)) {
        for (DeleteFile file : reader) {
          if (file.content() != FileContent.EQUALITY_DELETES) {
            continue;
          }
          long min = tableMin;
          if (specs.get(file.specId()).isPartitioned()) {
            StructLikeMap<Long> bySpec = minSeq.get(file.specId());
            Long found = bySpec == null ? null : bySpec.get(file.partition());
            min = found == null ? Long.MAX_VALUE : found;
          }
          if (file.dataSequenceNumber() <= min) {
            dangling.add(file.copy());
          }
        }
      }
    }
    if (!dangling.isEmpty()) {
      RewriteFiles rewrite = table.newRewrite();
      dangling.forEach(rewrite::deleteFile);
      rewrite.commit();
    }
    return dangling.size();
  }

  private static Object deserialize(byte[] bytes) throws IOException, ClassNotFoundException {
    try (ObjectInputStream in = new ObjectInputStream(new ByteArrayInputStream(bytes)) {
      @Override
      protected Class<?> resolveClass(java.io.ObjectStreamClass desc) throws IOException, ClassNotFoundException {
        return Class.forName(desc.getName(), false, EqualityDeltaWriter.class.getClassLoader());
      }
    }) {
      return in.readObject();
    }
  }

  /** Executor side: one Spark partition of rows -> its data and equality-delete files (serialized). */
  static final class Task implements FlatMapFunction<Iterator<InternalRow>, byte[]>, Serializable {
    private static final long serialVersionUID = 1L;
    private final Broadcast<Table> shared;
    private final StructType sparkType;
    private final int[] equalityIds;
    private final int[] keyOrdinals;
    private final int deleteFlag;
    private final String operationId;

    Task(Broadcast<Table> shared, StructType sparkType, int[] equalityIds, int[] keyOrdinals, int deleteFlag,
         String operationId) {
      this.shared = shared;
      this.sparkType = sparkType;
      this.equalityIds = equalityIds;
      this.keyOrdinals = keyOrdinals;
      this.deleteFlag = deleteFlag;
      this.operationId = operationId;
    }

    @Override
    public Iterator<byte[]> call(Iterator<InternalRow> rows) throws IOException {
      Table table = shared.value();
      Schema schema = table.schema();
      PartitionSpec spec = table.spec();
      Schema deleteSchema = TypeUtilSelect.select(schema, equalityIds);
      StructType dataType = new StructType(java.util.Arrays.copyOf(sparkType.fields(), deleteFlag));
      StructField[] keyFields = new StructField[keyOrdinals.length];
      DataType[] keyTypes = new DataType[keyOrdinals.length];
      for (int i = 0; i < keyOrdinals.length; i++) {
        keyFields[i] = sparkType.fields()[keyOrdinals[i]];
        keyTypes[i] = keyFields[i].dataType();
      }
      StructType deleteType = new StructType(keyFields);
      Factory factory = new Factory(table, schema, dataType, equalityIds, deleteSchema, deleteType);
      TaskContext context = TaskContext.get();
      OutputFileFactory files = OutputFileFactory.builderFor(table, context.partitionId(), context.taskAttemptId())
          .format(FileFormat.PARQUET).operationId(operationId).build();
      long targetSize = PropertyUtil.propertyAsLong(table.properties(), TableProperties.WRITE_TARGET_FILE_SIZE_BYTES,
          TableProperties.WRITE_TARGET_FILE_SIZE_BYTES_DEFAULT);
      FanoutDataWriter<InternalRow> data = new FanoutDataWriter<>(factory, files, table.io(), targetSize);
      Map<PartitionKey, RollingEqualityDeleteWriter<InternalRow>> deletes = new HashMap<>();
      PartitionKey partition = new PartitionKey(spec, schema);
      KeyRow wrapper = new KeyRow(schema, sparkType);
      boolean partitioned = spec.isPartitioned();
      try {
        while (rows.hasNext()) {
          InternalRow row = rows.next();
          partition.partition(wrapper.wrap(row));
          RollingEqualityDeleteWriter<InternalRow> deleteWriter = deletes.get(partition);
          if (deleteWriter == null) {
            PartitionKey copy = partition.copy();
            deleteWriter = new RollingEqualityDeleteWriter<>(factory, files, table.io(), targetSize, spec,
                partitioned ? copy : null);
            deletes.put(copy, deleteWriter);
          }
          Object[] key = new Object[keyOrdinals.length];
          for (int i = 0; i < keyOrdinals.length; i++) {
            key[i] = row.isNullAt(keyOrdinals[i]) ? null : row.get(keyOrdinals[i], keyTypes[i]);
          }
          deleteWriter.write(new GenericInternalRow(key).copy());
          if (!row.getBoolean(deleteFlag)) {
            data.write(row, spec, partitioned ? partition : null);
          }
        }
      } finally {
        data.close();
        for (RollingEqualityDeleteWriter<InternalRow> writer : deletes.values()) {
          writer.close();
        }
      }
      List<DataFile> dataFiles = new ArrayList<>(data.result().dataFiles());
      List<DeleteFile> deleteFiles = new ArrayList<>();
      for (RollingEqualityDeleteWriter<InternalRow> writer : deletes.values()) {
        deleteFiles.addAll(writer.result().deleteFiles());
      }
      ByteArrayOutputStream bytes = new ByteArrayOutputStream();
      try (ObjectOutputStream out = new ObjectOutputStream(bytes)) {
        out.writeObject(new Object[] {dataFiles, deleteFiles});
      }
      return Collections.singletonList(bytes.toByteArray()).iterator();
    }
  }

  /** The key columns of a schema, by field id. */
  static final class TypeUtilSelect {
    static Schema select(Schema schema, int[] ids) {
      List<Integer> list = new ArrayList<>();
      for (int id : ids) {
        list.add(id);
      }
      return org.apache.iceberg.types.TypeUtil.select(schema, new java.util.HashSet<>(list));
    }
  }

  /** Iceberg's file writer factory over Spark's internal rows (Parquet only). */
  static final class Factory extends BaseFileWriterFactory<InternalRow> {
    private final StructType dataType;
    private final StructType deleteType;

    Factory(Table table, Schema schema, StructType dataType, int[] equalityIds, Schema deleteSchema,
            StructType deleteType) {
      super(table, FileFormat.PARQUET, schema, SortOrder.unsorted(), FileFormat.PARQUET, equalityIds, deleteSchema,
          SortOrder.unsorted(), null);
      this.dataType = dataType;
      this.deleteType = deleteType;
    }

    @Override
    protected void configureDataWrite(Parquet.DataWriteBuilder builder) {
      builder.createWriterFunc(message -> SparkParquetWriters.buildWriter(dataType, message));
    }

    @Override
    protected void configureEqualityDelete(Parquet.DeleteWriteBuilder builder) {
      builder.createWriterFunc(message -> SparkParquetWriters.buildWriter(deleteType, message));
    }

    @Override
    protected void configurePositionDelete(Parquet.DeleteWriteBuilder builder) {
      throw new UnsupportedOperationException("position deletes are not written here");
    }

    @Override
    protected void configureDataWrite(Avro.DataWriteBuilder builder) {
      throw new UnsupportedOperationException("Parquet only");
    }

    @Override
    protected void configureEqualityDelete(Avro.DeleteWriteBuilder builder) {
      throw new UnsupportedOperationException("Parquet only");
    }

    @Override
    protected void configurePositionDelete(Avro.DeleteWriteBuilder builder) {
      throw new UnsupportedOperationException("Parquet only");
    }

    @Override
    protected void configureDataWrite(ORC.DataWriteBuilder builder) {
      throw new UnsupportedOperationException("Parquet only");
    }

    @Override
    protected void configureEqualityDelete(ORC.DeleteWriteBuilder builder) {
      throw new UnsupportedOperationException("Parquet only");
    }

    @Override
    protected void configurePositionDelete(ORC.DeleteWriteBuilder builder) {
      throw new UnsupportedOperationException("Parquet only");
    }
  }

  /** A Spark row seen as an Iceberg struct for partition transforms: Iceberg's value classes, top level. */
  static final class KeyRow implements StructLike {
    private final Type[] types;
    private final DataType[] sparkTypes;
    private InternalRow row;

    KeyRow(Schema schema, StructType sparkType) {
      int n = schema.columns().size();
      this.types = new Type[n];
      this.sparkTypes = new DataType[n];
      for (int i = 0; i < n; i++) {
        types[i] = schema.columns().get(i).type();
        sparkTypes[i] = sparkType.fields()[i].dataType();
      }
    }

    KeyRow wrap(InternalRow next) {
      this.row = next;
      return this;
    }

    @Override
    public int size() {
      return types.length;
    }

    @Override
    public <T> T get(int pos, Class<T> javaClass) {
      if (row.isNullAt(pos)) {
        return null;
      }
      Object value;
      switch (types[pos].typeId()) {
        case STRING:
          value = row.getUTF8String(pos).toString();
          break;
        case UUID:
          value = UUID.fromString(row.getUTF8String(pos).toString());
          break;
        case DECIMAL:
          org.apache.iceberg.types.Types.DecimalType decimal = (org.apache.iceberg.types.Types.DecimalType) types[pos];
          value = row.getDecimal(pos, decimal.precision(), decimal.scale()).toJavaBigDecimal();
          break;
        case BINARY:
        case FIXED:
          value = ByteBuffer.wrap(row.getBinary(pos));
          break;
        default:
          value = row.get(pos, sparkTypes[pos]);
      }
      return javaClass.cast(value);
    }

    @Override
    public <T> void set(int pos, T value) {
      throw new UnsupportedOperationException("read only");
    }
  }
}
