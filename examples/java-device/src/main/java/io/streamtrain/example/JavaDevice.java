package io.streamtrain.example;

import io.streamtrain.DType;
import io.streamtrain.Sample;
import java.io.FileInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Random;
import java.util.Set;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * A device that feeds streamtrain from Java: it sends {@code --count} float32 samples of shape
 * ({@code --rows}, {@code --features}) to the device topic {@code <prefix>.device.<id>}.
 *
 * <p>Each record's value is the Sample in Avro's single-object encoding, written by the encoder of the
 * class generated from streamtrain/wire/schemas/Sample.avsc ({@code C3 01}, the schema's 8-byte
 * fingerprint, the Avro body); its header {@code st-size} holds the sample's size (rows) in decimal ASCII.
 * The producer is idempotent with {@code acks=all}, so a retry never writes a sample twice.
 *
 * <pre>
 * java -jar target/streamtrain-java-device.jar --bootstrap localhost:9092 --device 0 --count 300
 * </pre>
 */
public final class JavaDevice {

    private static final String USAGE = String.join("\n",
        "usage: java -jar streamtrain-java-device.jar --device ID [options]",
        "  --bootstrap HOST:PORT    Kafka bootstrap servers (default localhost:9092)",
        "  --prefix PREFIX          streamtrain's kafka.topic_prefix (default streamtrain)",
        "  --device ID              the device id: samples go to <prefix>.device.<ID>",
        "  --count N                samples to send (default 100)",
        "  --start-seq N            seq of the first sample (default 0; the next ones count up)",
        "  --rows N                 rows per sample: its size, shape[0] (default 8)",
        "  --features N             values per row, shape[1] (default 16)",
        "  --classes N              labels are seq % N (default 4)",
        "  --rate R                 samples per second, 0 = as fast as Kafka takes them (default 0)",
        "  --seed N                 seed of the random payloads (default 1)",
        "  --producer.config FILE   more Kafka client properties (security: SASL, TLS)");

    private static final Set<String> OPTIONS = Set.of("--bootstrap", "--prefix", "--device", "--count",
        "--start-seq", "--rows", "--features", "--classes", "--rate", "--seed", "--producer.config");

    private JavaDevice() {
    }

    public static void main(String[] argv) throws Exception {
        int status;
        try {
            Map<String, String> args = parse(argv);
            if (args.containsKey("help")) {
                System.out.println(USAGE);
                return;
            }
            status = run(args);
        } catch (IllegalArgumentException e) {  // NumberFormatException included
            System.err.println(e.getMessage() + "\n" + USAGE);
            status = 2;
        }
        System.exit(status);
    }

    private static int run(Map<String, String> args) throws IOException, InterruptedException {
        String device = required(args, "device");
        String topic = args.getOrDefault("prefix", "streamtrain") + ".device." + device;
        long count = Long.parseLong(args.getOrDefault("count", "100"));
        long startSeq = Long.parseLong(args.getOrDefault("start-seq", "0"));
        int rows = Integer.parseInt(args.getOrDefault("rows", "8"));
        int features = Integer.parseInt(args.getOrDefault("features", "16"));
        int classes = Integer.parseInt(args.getOrDefault("classes", "4"));
        double rate = Double.parseDouble(args.getOrDefault("rate", "0"));
        Random random = new Random(Long.parseLong(args.getOrDefault("seed", "1")));

        AtomicLong failed = new AtomicLong();
        AtomicReference<Exception> firstError = new AtomicReference<>();
        long began = System.nanoTime();
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(producerProperties(args))) {
            for (long i = 0; i < count; i++) {
                if (rate > 0) {
                    pace(began, i, rate);
                }
                Sample sample = sample(device, startSeq + i, rows, features, classes, random);
                ProducerRecord<byte[], byte[]> record = new ProducerRecord<>(topic, null, encode(sample));
                record.headers().add("st-size", Integer.toString(sample.getSize()).getBytes(StandardCharsets.US_ASCII));
                producer.send(record, (metadata, error) -> {
                    if (error != null) {
                        failed.incrementAndGet();
                        firstError.compareAndSet(null, error);
                    }
                });
            }
            producer.flush();
        }
        if (failed.get() > 0) {
            System.err.printf("%d of %d samples were not delivered to %s: %s%n", failed.get(), count, topic,
                firstError.get());
            return 1;
        }
        System.out.printf("sent %d samples (seq %d..%d, %d x %d float32) to %s%n", count, startSeq,
            startSeq + count - 1, rows, features, topic);
        return 0;
    }

    /** One sample: a float32 array of shape (rows, features), little-endian, labelled seq % classes. */
    static Sample sample(String device, long seq, int rows, int features, int classes, Random random) {
        ByteBuffer data = ByteBuffer.allocate(rows * features * Float.BYTES).order(ByteOrder.LITTLE_ENDIAN);
        for (int i = 0; i < rows * features; i++) {
            data.putFloat((float) random.nextGaussian());
        }
        data.flip();
        Map<String, String> metadata = new HashMap<>();
        metadata.put("source", "java-device");
        return Sample.newBuilder()
            .setDeviceId(device)
            .setSeq(seq)
            .setProducedAt(System.currentTimeMillis())
            .setSize(rows)  // size is shape[0], the variable-length axis
            .setShape(List.of(rows, features))
            .setDtype(DType.float32)
            .setData(data)
            .setLabel(seq % classes)
            .setTarget(null)  // classification: the label is the target
            .setMetadata(metadata)
            .build();
    }

    /** Avro's single-object encoding: C3 01, the 8-byte little-endian schema fingerprint, the Avro body. */
    static byte[] encode(Sample sample) throws IOException {
        ByteBuffer buffer = Sample.getEncoder().encode(sample);
        byte[] bytes = new byte[buffer.remaining()];
        buffer.get(bytes);
        return bytes;
    }

    private static Properties producerProperties(Map<String, String> args) throws IOException {
        Properties props = new Properties();
        String file = args.get("producer.config");
        if (file != null) {
            try (InputStream in = new FileInputStream(file)) {
                props.load(in);
            }
        }
        if (args.containsKey("bootstrap") || !props.containsKey(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG)) {
            props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, args.getOrDefault("bootstrap", "localhost:9092"));
        }
        // Idempotent, acknowledged by every in-sync replica: a retry never writes a sample twice, and an
        // acknowledged sample is not lost with a broker.
        props.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        props.put(ProducerConfig.ACKS_CONFIG, "all");
        props.putIfAbsent(ProducerConfig.LINGER_MS_CONFIG, "5");
        props.putIfAbsent(ProducerConfig.COMPRESSION_TYPE_CONFIG, "lz4");
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        return props;
    }

    private static void pace(long began, long sent, double rate) throws InterruptedException {
        long due = began + (long) (sent / rate * 1e9);
        long wait = due - System.nanoTime();
        if (wait > 0) {
            Thread.sleep(wait / 1_000_000, (int) (wait % 1_000_000));
        }
    }

    private static String required(Map<String, String> args, String name) {
        String value = args.get(name);
        if (value == null) {
            throw new IllegalArgumentException("--" + name + " is required");
        }
        return value;
    }

    private static Map<String, String> parse(String[] argv) {
        Map<String, String> args = new HashMap<>();
        for (int i = 0; i < argv.length; i++) {
            String arg = argv[i];
            if (arg.equals("-h") || arg.equals("--help")) {
                args.put("help", "");
            } else if (OPTIONS.contains(arg) && i + 1 < argv.length) {
                args.put(arg.substring(2), argv[++i]);
            } else {
                throw new IllegalArgumentException("unknown option or missing value: " + arg);
            }
        }
        return args;
    }
}
