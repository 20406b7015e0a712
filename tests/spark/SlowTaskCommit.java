// A Spark commit protocol that, once, holds a write task before its commit
// (tests/spark/slow_commit.py builds it; docs there).
import java.io.File;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;

import org.apache.hadoop.mapreduce.TaskAttemptContext;
import org.apache.spark.internal.io.FileCommitProtocol;
import org.apache.spark.sql.execution.datasources.SQLHadoopMapReduceCommitProtocol;

public class SlowTaskCommit extends SQLHadoopMapReduceCommitProtocol {
    public SlowTaskCommit(String jobId, String path, boolean dynamicPartitionOverwrite) {
        super(jobId, path, dynamicPartitionOverwrite);
    }

    private static void say(File f, String text) {
        try {
            Files.write(f.toPath(), text.getBytes(StandardCharsets.UTF_8));
        } catch (Exception e) {
            // best effort: the test waits for the file and says so when it is missing
        }
    }

    @Override
    public FileCommitProtocol.TaskCommitMessage commitTask(TaskAttemptContext context) {
        String where = System.getProperty("offbroadway.test.slowCommit");
        if (where != null) {
            File flag = new File(where);
            File taken = new File(where + ".taken");
            if (flag.renameTo(taken)) {   // the first task to see the flag takes it
                long ms = 0;
                try {
                    ms = Long.parseLong(new String(Files.readAllBytes(taken.toPath()),
                                                   StandardCharsets.UTF_8).trim());
                } catch (Exception e) {
                    ms = 0;
                }
                long t0 = System.nanoTime();
                try {
                    Thread.sleep(ms);
                } catch (InterruptedException e) {
                    say(new File(where + ".done"), "interrupted after "
                        + (System.nanoTime() - t0) / 1000000 + " ms");
                    Thread.currentThread().interrupt();
                    throw new RuntimeException("slowed task commit interrupted", e);
                }
                say(new File(where + ".done"), "slept " + ms + " ms");
            }
        }
        return super.commitTask(context);
    }
}
