package icecdc.tally;

import java.util.concurrent.ConcurrentHashMap;
import org.apache.spark.sql.api.java.UDF2;
import org.apache.spark.util.LongAccumulator;

/**
 * A MERGE clause's condition that counts the rows it is asked about and holds for each of them:
 * {@code tally(<any source column>, '<tag>')} adds one to the counter opened under that tag.
 *
 * <p>Why: Spark's MERGE reports no counts of its own, and a target's snapshot summary cannot tell an update
 * from a delete (both add one position delete). Spark asks a matched row's clause conditions in order and
 * stops at the first that holds, so a tally last in each matched clause's condition counts exactly the rows
 * that clause takes, in the MERGE's own job. The counters are accumulators (a failed task's additions are
 * dropped, as an observation's are), shipped with the tasks inside this object. One instance per session
 * under one name, a tag per MERGE: the tag is a string in the plan, which Spark's generated code reads as a
 * reference, so every MERGE compiles to the same code.
 */
public final class MergeTally implements UDF2<Object, String, Boolean> {
    private static final long serialVersionUID = 1L;
    private final ConcurrentHashMap<String, LongAccumulator> counters = new ConcurrentHashMap<>();

    public void open(String tag, LongAccumulator counter) {
        counters.put(tag, counter);
    }

    public void close(String tag) {
        counters.remove(tag);
    }

    @Override
    public Boolean call(Object ignored, String tag) {
        LongAccumulator counter = counters.get(tag);
        if (counter == null) {
            throw new IllegalStateException("no MERGE tally open under " + tag);
        }
        counter.add(1L);
        return Boolean.TRUE;
    }
}
