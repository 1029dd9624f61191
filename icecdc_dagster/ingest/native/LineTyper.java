package icecdc.typing;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import java.io.IOException;
import java.math.BigDecimal;
import java.math.RoundingMode;
import java.time.Instant;
import java.time.LocalDate;
import java.time.LocalDateTime;
import java.time.LocalTime;
import java.time.ZoneOffset;
import java.util.Base64;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;
import java.io.Serializable;
import java.util.Iterator;
import org.apache.spark.api.java.function.FlatMapFunction;
import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.catalyst.CatalystTypeConverters$;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.util.ArrayBasedMapData;
import org.apache.spark.sql.catalyst.util.GenericArrayData;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;
import org.apache.spark.util.CollectionAccumulator;
import org.apache.spark.util.LongAccumulator;
import scala.Function1;

/**
 * One plain Debezium line typed for a fixed target in one pass of a streaming JSON parser, or routed.
 *
 * <p>Why: the same rules as Spark expressions read each line into maps of field texts, then guessed each
 * token's kind back from its text (a regex per column) and checked the line's shape with more parses and
 * searches; here the parser says each token's kind, so a value is typed where it is read. The result is
 * {@code (fast, tombstone, op, ignored, v0..vn)}. {@code fast} holds only where the row is provably the one the
 * Python rules ({@code debezium.parse_line} + {@code coercion.coerce}) give; any doubt (a token kind or form
 * the rules convert by a declared rule, a value that does not fit, malformed JSON, a duplicate key, text after
 * the object, a {@code payload} or {@code schema} key) routes the line to those rules, which give the value or
 * the dead-letter reason. Null keys and required columns are judged after, from the values ({@link Rows}).
 */
public final class LineTyper implements Serializable {
    private static final long serialVersionUID = 1L;
    // Column kinds, as icecdc_dagster/ingest/native/line_typer.py names them.
    static final int STRING = 0, LONG = 1, INT = 2, BOOLEAN = 3, DOUBLE = 4, DECIMAL = 5, DATE = 6,
            TIMESTAMP = 7, TIMESTAMP_NTZ = 8, BINARY = 9, OTHER = 10;
    private static final Object ROUTE = new Object();
    private static final Map<String, String> OPS = new HashMap<>();
    static {  // debezium.OPS
        for (String op : new String[] {"c", "r", "i", "insert", "create", "index"}) OPS.put(op, "insert");
        for (String op : new String[] {"u", "update"}) OPS.put(op, "update");
        for (String op : new String[] {"d", "delete"}) OPS.put(op, "delete");
    }
    // Python's datetime range (year 1..9999), in microseconds and days from the epoch.
    private static final long MIN_MICROS = -62135596800000000L, MAX_MICROS = 253402300799999999L;
    private static final long MIN_DAYS = -719162L, MAX_DAYS = 2932896L;

    private final String[] names;
    private final int[] kinds, precisions, scales;
    private final boolean[] keys;
    private final HashMap<String, Integer> index = new HashMap<>();
    private final HashSet<String> known = new HashSet<>();
    private transient JsonFactory factory;

    public LineTyper(String[] names, int[] kinds, int[] precisions, int[] scales, boolean[] keys, String[] known) {
        this.names = names;
        this.kinds = kinds;
        this.precisions = precisions;
        this.scales = scales;
        this.keys = keys;
        for (int i = 0; i < names.length; i++) index.put(names[i], i);
        for (String name : known) this.known.add(name);
    }

    private JsonFactory factory() {
        if (factory == null) {  // strict: Jackson's defaults refuse what Python's json refuses, and duplicates too
            factory = JsonFactory.builder().enable(com.fasterxml.jackson.core.StreamReadFeature.STRICT_DUPLICATE_DETECTION)
                    .build();
        }
        return factory;
    }

    /** The line typed: {@code (fast, tombstone, op, ignored, v0..vn)}. */
    public Row call(String line) {
        Object[] out = new Object[4 + names.length];
        out[0] = Boolean.FALSE;
        out[1] = Boolean.FALSE;
        if (line != null) {
            try (JsonParser parser = factory().createParser(line)) {
                read(parser, line, out);
            } catch (IOException | RuntimeException routed) {  // malformed JSON or a value Java refuses: routed
                out[0] = Boolean.FALSE;
            }
        }
        return RowFactory.create(out);
    }

    /** The line's envelope: the op and the image its op reads (before for a delete, after otherwise). */
    private void read(JsonParser parser, String line, Object[] out) throws IOException {
        JsonToken token = parser.nextToken();
        if (token == null || (token == JsonToken.VALUE_NULL && parser.nextToken() == null)) {
            out[0] = Boolean.TRUE;  // a blank line or JSON null: a tombstone
            out[1] = Boolean.TRUE;
            return;
        }
        if (token != JsonToken.START_OBJECT) return;
        String op = null;
        Object[] after = null;
        int afterIgnored = -1;
        long beforeStart = -1, beforeEnd = -1;
        while ((token = parser.nextToken()) == JsonToken.FIELD_NAME) {
            String name = parser.getCurrentName();
            JsonToken value = parser.nextToken();
            switch (name) {
                case "op":
                    if (value != JsonToken.VALUE_STRING) return;  // the Python rules: an unknown op
                    op = parser.getText();
                    break;
                case "after":
                    after = null;
                    if (value == JsonToken.START_OBJECT) {  // typed as read: most ops read it
                        after = new Object[names.length];
                        afterIgnored = image(parser, after, false);
                    } else {
                        parser.skipChildren();
                    }
                    break;
                case "before":  // a delete's image: remembered, read when the op says so
                    beforeStart = value == JsonToken.START_OBJECT ? parser.getTokenLocation().getCharOffset() : -1;
                    parser.skipChildren();
                    beforeEnd = beforeStart < 0 ? -1 : parser.getCurrentLocation().getCharOffset();
                    break;
                case "payload":
                case "schema":
                    return;  // not a plain line
                default:
                    parser.skipChildren();
            }
        }
        if (token != JsonToken.END_OBJECT || parser.nextToken() != null) return;  // text after the object
        String mapped = op == null || !ascii(op) ? null : OPS.get(op.toLowerCase(java.util.Locale.ROOT));
        if (mapped == null) return;
        Object[] values = after;
        int ignored = afterIgnored;
        if (mapped.equals("delete")) {
            if (beforeStart < 0) return;
            values = new Object[names.length];
            try (JsonParser before = factory().createParser(line.substring((int) beforeStart, (int) beforeEnd))) {
                before.nextToken();
                ignored = image(before, values, true);
            }
        }
        if (values == null || ignored < 0) return;
        out[0] = Boolean.TRUE;
        out[2] = mapped;
        out[3] = ignored;
        System.arraycopy(values, 0, out, 4, values.length);
    }

    /** The image's fields into {@code values}: the count of fields the table does not know, or -1 (routed). */
    private int image(JsonParser parser, Object[] values, boolean deleting) throws IOException {
        int ignored = 0;
        boolean routed = false;
        JsonToken token;
        while ((token = parser.nextToken()) == JsonToken.FIELD_NAME) {
            String name = parser.getCurrentName();
            JsonToken kind = parser.nextToken();
            Integer at = index.get(name);
            if (at == null || (deleting && !keys[at]) || kind == JsonToken.VALUE_NULL || routed) {
                if (at == null && !known.contains(name)) ignored++;
                parser.skipChildren();  // a delete matches on its key only
                continue;
            }
            Object value = value(kinds[at], parser, kind, at);
            if (value == ROUTE) {
                routed = true;  // read on to the end of the object: its own syntax must hold
                parser.skipChildren();
                continue;
            }
            values[at] = value;
        }
        return routed ? -1 : ignored;
    }

    /** A field's value as the Python rules would type it, or ROUTE when they must decide. */
    private Object value(int kind, JsonParser parser, JsonToken token, int at) throws IOException {
        switch (kind) {
            case STRING:
                return token == JsonToken.VALUE_STRING ? string(parser.getText()) : ROUTE;  // else: stringified
            case LONG:
                return integer(parser, token, 18, false);
            case INT:
                return integer(parser, token, 9, true);
            case BOOLEAN:
                if (token == JsonToken.VALUE_TRUE || token == JsonToken.VALUE_FALSE) return token == JsonToken.VALUE_TRUE;
                if (token == JsonToken.VALUE_STRING) {
                    String text = parser.getText();
                    return text.equals("true") ? Boolean.TRUE : text.equals("false") ? Boolean.FALSE : ROUTE;
                }
                return ROUTE;
            case DOUBLE:
                return floating(parser, token);
            case DECIMAL:
                if (token == JsonToken.VALUE_NUMBER_INT || token == JsonToken.VALUE_NUMBER_FLOAT
                        || (token == JsonToken.VALUE_STRING && plainNumber(parser.getText()))) {
                    return decimal(parser.getText(), precisions[at], scales[at]);
                }
                return ROUTE;
            case DATE:
                return date(parser, token);
            case TIMESTAMP:
            case TIMESTAMP_NTZ:
                return timestamp(parser, token, kind == TIMESTAMP_NTZ);
            case BINARY:
                return token == JsonToken.VALUE_STRING ? base64(parser.getText()) : ROUTE;
            default:  // float (narrowed twice by the Python rules), nested and other types: the Python rules
                return ROUTE;
        }
    }

    /** A string without a lone surrogate (the Python path and Spark would render one differently). */
    private static Object string(String text) {
        for (int i = 0; i < text.length(); i++) {
            char c = text.charAt(i);
            if (Character.isSurrogate(c)) {
                if (!Character.isHighSurrogate(c) || i + 1 >= text.length() || !Character.isLowSurrogate(text.charAt(i + 1))) {
                    return ROUTE;
                }
                i++;
            }
        }
        return text;
    }

    /** An integer token that fits, or a string of at most {@code digits} digits (Python: a numeric string). */
    private static Object integer(JsonParser parser, JsonToken token, int digits, boolean narrow) throws IOException {
        if (token == JsonToken.VALUE_NUMBER_INT) {
            JsonParser.NumberType type = parser.getNumberType();
            if (type == JsonParser.NumberType.INT) return narrow ? (Object) parser.getIntValue() : (Object) parser.getLongValue();
            if (type == JsonParser.NumberType.LONG && !narrow) return parser.getLongValue();
            return ROUTE;  // out of range: the Python rules name the wider type
        }
        if (token == JsonToken.VALUE_STRING) {
            String text = parser.getText();
            if (!digitsOnly(text, digits)) return ROUTE;
            return narrow ? (Object) Integer.parseInt(text) : (Object) Long.parseLong(text);
        }
        return ROUTE;  // fractions, booleans...: the Python rules decide
    }

    /** A double: integers exactly (|n| <= 2^53), fractions and numeric strings to the nearest (Java's
     * parseDouble and Python's float of a Decimal both round correctly), never an infinity. */
    private static Object floating(JsonParser parser, JsonToken token) throws IOException {
        if (token == JsonToken.VALUE_NUMBER_INT) {
            JsonParser.NumberType type = parser.getNumberType();
            if (type == JsonParser.NumberType.BIG_INTEGER) return ROUTE;
            long n = parser.getLongValue();
            return n >= -(1L << 53) && n <= (1L << 53) ? (Object) (double) n : ROUTE;
        }
        String text;
        if (token == JsonToken.VALUE_NUMBER_FLOAT) {
            text = parser.getText();
        } else if (token == JsonToken.VALUE_STRING && plainNumber(parser.getText())) {
            text = parser.getText();
        } else {
            return ROUTE;
        }
        double d = Double.parseDouble(text);
        return Double.isInfinite(d) || Double.isNaN(d) ? ROUTE : (Object) d;
    }

    /** {@code coercion._decimal}: exact at the column's scale, its integer digits within the precision. */
    private static Object decimal(String text, int precision, int scale) {
        BigDecimal d = new BigDecimal(text);
        if (d.signum() != 0 && d.precision() - d.scale() > 38) return ROUTE;
        BigDecimal scaled;
        try {
            scaled = d.setScale(scale, RoundingMode.UNNECESSARY);
        } catch (ArithmeticException more) {
            return ROUTE;  // more fraction digits than the scale: the Python rules name it
        }
        int integerDigits = scaled.signum() == 0 ? 0 : Math.max(scaled.precision() - scale, 0);
        return integerDigits + scale <= precision ? scaled : ROUTE;
    }

    /** {@code coercion._date}: YYYY-MM-DD, or days from the epoch within Python's date range. */
    private static Object date(JsonParser parser, JsonToken token) throws IOException {
        if (token == JsonToken.VALUE_NUMBER_INT) {
            if (parser.getNumberType() != JsonParser.NumberType.INT) return ROUTE;
            long days = parser.getIntValue();
            return days >= MIN_DAYS && days <= MAX_DAYS ? LocalDate.ofEpochDay(days) : ROUTE;
        }
        if (token != JsonToken.VALUE_STRING) return ROUTE;
        String text = parser.getText();
        if (text.length() != 10 || text.charAt(4) != '-' || text.charAt(7) != '-') return ROUTE;
        int year = number(text, 0, 4), month = number(text, 5, 7), day = number(text, 8, 10);
        if (year < 1 || month < 0 || day < 0) return ROUTE;
        return LocalDate.of(year, month, day);  // an impossible date throws: routed
    }

    /** {@code coercion._timestamp}: epoch millis (below 1e14) or micros (below 1e17) as numbers, or
     * ISO-8601 {@code YYYY-MM-DD[T ]HH:MM:SS[.f{1,6}][Z|±HH:MM]} (naive meaning UTC); the UTC instant, or
     * its UTC wall clock for a timestamp_ntz column. */
    private static Object timestamp(JsonParser parser, JsonToken token, boolean wallClock) throws IOException {
        long micros;
        if (token == JsonToken.VALUE_NUMBER_INT) {
            JsonParser.NumberType type = parser.getNumberType();
            if (type == JsonParser.NumberType.BIG_INTEGER) return ROUTE;
            long n = parser.getLongValue();
            if (n > -100_000_000_000_000L && n < 100_000_000_000_000L) {
                micros = n * 1000L;
            } else if (n > -100_000_000_000_000_000L && n < 100_000_000_000_000_000L) {
                micros = n;
            } else {
                return ROUTE;  // nanos: the Python rules count what they truncate
            }
        } else if (token == JsonToken.VALUE_STRING) {
            Long iso = isoMicros(parser.getText());
            if (iso == null) return ROUTE;
            micros = iso;
        } else {
            return ROUTE;
        }
        if (micros < MIN_MICROS || micros > MAX_MICROS) return ROUTE;
        long seconds = Math.floorDiv(micros, 1_000_000L);
        int nanos = (int) Math.floorMod(micros, 1_000_000L) * 1000;
        return wallClock ? LocalDateTime.ofEpochSecond(seconds, nanos, ZoneOffset.UTC) : Instant.ofEpochSecond(seconds, nanos);
    }

    private static Long isoMicros(String text) {
        int n = text.length();
        if (n < 19 || text.charAt(4) != '-' || text.charAt(7) != '-' || text.charAt(13) != ':' || text.charAt(16) != ':'
                || (text.charAt(10) != 'T' && text.charAt(10) != ' ')) {
            return null;
        }
        int year = number(text, 0, 4), month = number(text, 5, 7), day = number(text, 8, 10);
        int hour = number(text, 11, 13), minute = number(text, 14, 16), second = number(text, 17, 19);
        if (year < 1 || month < 0 || day < 0 || hour < 0 || minute < 0 || second < 0) return null;
        int at = 19, micro = 0;
        if (at < n && text.charAt(at) == '.') {
            int end = at + 1;
            while (end < n && isDigit(text.charAt(end))) end++;
            int digits = end - at - 1;
            if (digits < 1 || digits > 6) return null;  // digits below the microsecond: counted by the Python rules
            micro = number(text, at + 1, end);
            for (int i = digits; i < 6; i++) micro *= 10;
            at = end;
        }
        ZoneOffset offset = ZoneOffset.UTC;
        if (at < n) {
            char sign = text.charAt(at);
            if ((sign == 'Z' || sign == 'z') && at + 1 == n) {
                at = n;
            } else if ((sign == '+' || sign == '-') && n - at == 6 && text.charAt(at + 3) == ':') {
                int hours = number(text, at + 1, at + 3), minutes = number(text, at + 4, at + 6);
                if (hours < 0 || minutes < 0) return null;
                offset = sign == '+' ? ZoneOffset.ofHoursMinutes(hours, minutes) : ZoneOffset.ofHoursMinutes(-hours, -minutes);
                at = n;
            } else {
                return null;
            }
        }
        LocalDateTime local = LocalDateTime.of(LocalDate.of(year, month, day), LocalTime.of(hour, minute, second));
        return Math.addExact(Math.multiplyExact(local.toEpochSecond(offset), 1_000_000L), (long) micro);
    }

    /** {@code base64.b64decode(validate=True)} on canonical text (decoded back to itself), else routed. */
    private static Object base64(String text) {
        if (text.length() % 4 != 0) return ROUTE;
        for (int i = 0; i < text.length(); i++) {
            char c = text.charAt(i);
            boolean padding = c == '=' && i >= text.length() - 2;
            if (!(padding || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || isDigit(c) || c == '+' || c == '/')) {
                return ROUTE;
            }
        }
        byte[] bytes = Base64.getDecoder().decode(text);
        return Base64.getEncoder().encodeToString(bytes).equals(text) ? bytes : ROUTE;
    }

    /** -?[0-9]+(.[0-9]+)?([eE][-+]?[0-9]+)?: the numeric strings Python's Decimal and Java read alike. */
    private static boolean plainNumber(String text) {
        int i = 0, n = text.length();
        if (i < n && text.charAt(i) == '-') i++;
        int start = i;
        while (i < n && isDigit(text.charAt(i))) i++;
        if (i == start) return false;
        if (i < n && text.charAt(i) == '.') {
            int fraction = ++i;
            while (i < n && isDigit(text.charAt(i))) i++;
            if (i == fraction) return false;
        }
        if (i < n && (text.charAt(i) == 'e' || text.charAt(i) == 'E')) {
            i++;
            if (i < n && (text.charAt(i) == '-' || text.charAt(i) == '+')) i++;
            int exponent = i;
            while (i < n && isDigit(text.charAt(i))) i++;
            if (i == exponent) return false;
        }
        return i == n;
    }

    private static boolean digitsOnly(String text, int most) {
        int start = !text.isEmpty() && text.charAt(0) == '-' ? 1 : 0;
        int digits = text.length() - start;
        if (digits < 1 || digits > most) return false;
        for (int i = start; i < text.length(); i++) if (!isDigit(text.charAt(i))) return false;
        return true;
    }

    /** The digits text[from, to) as a number, or -1 when any is not an ASCII digit. */
    private static int number(String text, int from, int to) {
        int value = 0;
        for (int i = from; i < to; i++) {
            char c = text.charAt(i);
            if (!isDigit(c)) return -1;
            value = value * 10 + (c - '0');
        }
        return value;
    }

    private static boolean isDigit(char c) {
        return c >= '0' && c <= '9';
    }

    private static boolean ascii(String text) {
        for (int i = 0; i < text.length(); i++) if (text.charAt(i) > 127) return false;
        return true;
    }

    /**
     * The batch's lines typed as the rows {@code line_typing.coerce_lines} gives: a Spark plan that is one
     * scan of {@code lines} mapped by {@link Rows}, no expression per column. Why: with the typing as Spark
     * expressions over this function's struct, every later step of a batch (its figures, filters, collapse
     * and write) analysed, optimised and generated code for the whole wide plan again: ~0.16 s of a 0.8 s
     * batch. {@code lines}: (file_index, source_file, source_offset, raw, extra...); {@code out}: the typed
     * columns, then op, order, reason, raw, source_file, source_offset, notes, widen, file_index, fast, extra;
     * {@code tally}: counts the rows as they are made ({@link #tally}).
     */
    public Dataset<Row> typedRows(Dataset<Row> lines, StructType out, boolean[] nullable,
                                         long orderShift, String[] words, Tally tally) {
        Rows rows = new Rows(this, out, nullable, orderShift, words, tally);
        RDD<InternalRow> typed = lines.queryExecution().toRdd().toJavaRDD().mapPartitions(rows).rdd();
        return lines.sparkSession().internalCreateDataFrame(typed, out, false);
    }

    // The tally's slots (see Tally): lines typed whole, of them tombstones, with a reason (dead letters) and
    // their ignored fields; lines left to the Python rules; lines with a value in their first extra column.
    static final int WHOLE = 0, TOMBSTONES = 1, DEAD = 2, IGNORED = 3, ROUTED = 4, EXTRA = 5, SLOTS = 6;

    /** A new {@link Tally} for {@link #typedRows}, the key range kept for the columns {@code ranged}. */
    public Tally tally(SparkSession spark, int[] ranged) {
        return new Tally(spark, ranged);
    }

    /**
     * What {@link Rows} counts as it makes a batch's rows, each partition's share added once: the figures a batch
     * would otherwise aggregate over them (Spark's observation: an aggregate planned with each batch and
     * evaluated per row), and the range (min, max) of some key columns over the rows typed whole. Spark's own
     * accumulators inside (the driver reads their task updates; it could not load a class of ours there): a
     * failed task's share is dropped, a successful task's merged before its job returns.
     */
    public static final class Tally implements Serializable {
        private static final long serialVersionUID = 1L;
        private final LongAccumulator[] counts = new LongAccumulator[SLOTS];
        private final CollectionAccumulator<Object[]> ranges;
        private final int[] ranged;

        Tally(SparkSession spark, int[] ranged) {
            for (int i = 0; i < SLOTS; i++) counts[i] = spark.sparkContext().longAccumulator();  // unnamed: no UI
            this.ranges = spark.sparkContext().collectionAccumulator();
            this.ranged = ranged;
        }

        /** The counts, in the slots' order. */
        public long[] counts() {
            long[] values = new long[SLOTS];
            for (int i = 0; i < SLOTS; i++) values[i] = counts[i].value();
            return values;
        }

        /**
         * Per ranged column (in {@code ranged}'s order) its min and max over the rows typed whole, null where
         * none holds a value: Spark's order (strings by their UTF-8 bytes), strings as text, dates in days.
         */
        public Object[] ranges() {
            Object[] lo = new Object[ranged.length], hi = new Object[ranged.length];
            for (Object[] part : ranges.value()) {
                for (int j = 0; j < ranged.length; j++) {
                    widen(lo, hi, j, ((Object[]) part[0])[j]);
                    widen(lo, hi, j, ((Object[]) part[1])[j]);
                }
            }
            Object[] out = new Object[2 * ranged.length];
            for (int j = 0; j < ranged.length; j++) {
                out[2 * j] = lo[j] instanceof UTF8String ? lo[j].toString() : lo[j];
                out[2 * j + 1] = hi[j] instanceof UTF8String ? hi[j].toString() : hi[j];
            }
            return out;
        }

        void add(long[] partCounts, Object[] lo, Object[] hi) {
            for (int i = 0; i < SLOTS; i++) counts[i].add(partCounts[i]);
            if (ranged.length > 0) ranges.add(new Object[] {lo, hi});
        }

        /** {@code lo[j]}/{@code hi[j]} widened to hold {@code value} (internal values: Long, Integer, UTF8String). */
        @SuppressWarnings({"unchecked", "rawtypes"})
        static void widen(Object[] lo, Object[] hi, int j, Object value) {
            if (value == null) return;
            if (lo[j] == null || ((Comparable) value).compareTo(lo[j]) < 0) lo[j] = value;
            if (hi[j] == null || ((Comparable) value).compareTo(hi[j]) > 0) hi[j] = value;
        }
    }

    /** Executor side of {@link #typedRows}: each line's row, as {@code line_typing._rows} projected it. */
    static final class Rows implements FlatMapFunction<Iterator<InternalRow>, InternalRow>, Serializable {
        private static final long serialVersionUID = 1L;
        // words: the op names of debezium (insert, delete), our op column's values (tombstone, insert, delete,
        // upsert), the notes' key for ignored fields, and the reasons' texts (key, required, no-key delete).
        private final LineTyper typer;
        private final DataType[] types;
        private final boolean[] nullable;
        private final long orderShift;
        private final String[] words;
        private final int extra;
        private final DataType[] extraTypes;
        private final Tally tally;
        private transient Function1<Object, Object>[] converters;

        Rows(LineTyper typer, StructType out, boolean[] nullable, long orderShift, String[] words, Tally tally) {
            int n = typer.names.length;
            this.typer = typer;
            this.types = new DataType[n];
            for (int i = 0; i < n; i++) types[i] = out.fields()[i].dataType();
            this.nullable = nullable;
            this.orderShift = orderShift;
            this.words = words;
            this.tally = tally;
            this.extra = out.fields().length - n - 10;
            this.extraTypes = new DataType[extra];
            for (int j = 0; j < extra; j++) extraTypes[j] = out.fields()[n + 10 + j].dataType();
        }

        @SuppressWarnings("unchecked")
        private Function1<Object, Object>[] converters() {
            if (converters == null) {
                converters = new Function1[types.length];
                for (int i = 0; i < types.length; i++) {
                    converters[i] = CatalystTypeConverters$.MODULE$.createToCatalystConverter(types[i]);
                }
            }
            return converters;
        }

        @Override
        public Iterator<InternalRow> call(Iterator<InternalRow> lines) {
            Function1<Object, Object>[] convert = converters();
            long[] counts = new long[SLOTS];
            Object[] lo = new Object[tally.ranged.length], hi = new Object[tally.ranged.length];
            return new Iterator<InternalRow>() {
                private boolean tallied;

                @Override
                public boolean hasNext() {
                    boolean more = lines.hasNext();
                    if (!more && !tallied) {
                        tallied = true;
                        tally.add(counts, lo, hi);
                    }
                    return more;
                }

                @Override
                public InternalRow next() {
                    InternalRow row = row(lines.next(), convert, counts);
                    if (row.getBoolean(types.length + 9)) {  // typed whole: its key values widen the range
                        Object[] values = ((GenericInternalRow) row).values();
                        for (int j = 0; j < lo.length; j++) Tally.widen(lo, hi, j, values[tally.ranged[j]]);
                    }
                    return row;
                }
            };
        }

        private InternalRow row(InternalRow line, Function1<Object, Object>[] convert, long[] counts) {
            int n = types.length;
            String raw = line.isNullAt(3) ? null : line.getUTF8String(3).toString();
            Row typed = typer.call(raw);
            boolean fast = Boolean.TRUE.equals(typed.get(0));
            boolean tombstone = Boolean.TRUE.equals(typed.get(1));
            String op = (String) typed.get(2);
            Integer ignored = (Integer) typed.get(3);
            String reason = tombstone ? null : reason(typed, op);
            Object[] out = new Object[n + 10 + extra];
            if (reason == null) {
                for (int i = 0; i < n; i++) {
                    Object value = typed.get(4 + i);
                    out[i] = value == null ? null : convert[i].apply(value);
                }
            }
            String kind = tombstone ? words[2] : words[0].equals(op) ? words[3] : words[1].equals(op) ? words[4]
                    : words[5];
            long fileIndex = line.getLong(0);
            long offset = line.getLong(2);
            out[n] = UTF8String.fromString(kind);
            out[n + 1] = fileIndex * orderShift + offset;
            out[n + 2] = reason == null ? null : UTF8String.fromString(reason);
            out[n + 3] = reason != null || !fast ? UTF8String.fromString(raw) : null;
            out[n + 4] = line.isNullAt(1) ? null : line.getUTF8String(1).clone();
            out[n + 5] = offset;
            out[n + 6] = reason == null && ignored != null && ignored > 0
                    ? new ArrayBasedMapData(new GenericArrayData(new Object[] {UTF8String.fromString(words[6])}),
                                            new GenericArrayData(new Object[] {(long) ignored}))
                    : new ArrayBasedMapData(new GenericArrayData(new Object[0]), new GenericArrayData(new Object[0]));
            out[n + 7] = null;
            out[n + 8] = fileIndex;
            out[n + 9] = fast;
            for (int j = 0; j < extra; j++) {
                Object value = line.isNullAt(4 + j) ? null : line.get(4 + j, extraTypes[j]);
                out[n + 10 + j] = value instanceof UTF8String ? ((UTF8String) value).clone() : value;
            }
            count(counts, fast, tombstone, reason, reason == null && ignored != null ? ignored : 0,
                  extra > 0 && out[n + 10] != null);
            return new GenericInternalRow(out);
        }

        /** A row in the tally's slots (as the figures count it: ignored fields noted on a row without a reason). */
        private static void count(long[] counts, boolean fast, boolean tombstone, String reason, int ignored,
                                  boolean extraSet) {
            if (fast) {
                counts[WHOLE]++;
                if (tombstone) counts[TOMBSTONES]++;
                if (reason != null) counts[DEAD]++;
                counts[IGNORED] += ignored;
            } else {
                counts[ROUTED]++;
            }
            if (extraSet) counts[EXTRA]++;
        }

        /** line_typing._null_reason: the first key or required column (schema order) without a value. */
        private String reason(Row typed, String op) {
            Boolean deleting = op == null ? null : words[1].equals(op);
            boolean anyKey = false;
            for (int i = 0; i < types.length; i++) {
                boolean key = typer.keys[i];
                anyKey |= key;
                boolean needed = key || (!nullable[i] && Boolean.FALSE.equals(deleting));
                if (needed && typed.get(4 + i) == null) {
                    return (key ? words[7] : words[8]) + " column " + typer.names[i] + " " + words[9];
                }
            }
            return !anyKey && Boolean.TRUE.equals(deleting) ? words[10] : null;
        }
    }
}
