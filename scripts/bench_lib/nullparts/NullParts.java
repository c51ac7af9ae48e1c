// The `link` benchmark's S3 server: s3proxy (its own HTTP, authorization and
// multipart handling, unchanged) over a jclouds blobstore that keeps every
// object as it is, except multipart uploads' data. Each part's body is read to
// the end and counted, then only its length is stored; a completed upload is
// an object of that many zero bytes (HEAD and GET say its real length), as
// s3proxy's own null blobstore keeps every object. Small objects (PutObject:
// a repository's config and records) are stored and read back whole.
//
// Why: s3proxy's stores hash and write every part, then read, hash and copy
// them all again at CompleteMultipartUpload; on a small host that copy, not
// the link or the client, is what a shaped-link run measures. S3 completes an
// upload without copying. Nothing reads a staged segment's data back in the
// benchmark (no pipeline runs), and the agent's checks still run: its HEAD
// after completing compares the length the server counted with the bytes sent.
//
// Built at run time by scripts/bench_lib/s3proxy.py with javac against the
// s3proxy jar; run as `java -cp JAR:CLASSES braidbench.NullParts PROPERTIES`.
package braidbench;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ConcurrentHashMap;

import com.google.common.io.ByteSource;
import com.google.common.primitives.Longs;

import org.gaul.s3proxy.S3Proxy;
import org.jclouds.ContextBuilder;
import org.jclouds.blobstore.BlobStore;
import org.jclouds.blobstore.BlobStoreContext;
import org.jclouds.blobstore.domain.Blob;
import org.jclouds.blobstore.domain.BlobMetadata;
import org.jclouds.blobstore.domain.MultipartPart;
import org.jclouds.blobstore.domain.MultipartUpload;
import org.jclouds.blobstore.domain.MutableBlobMetadata;
import org.jclouds.blobstore.options.GetOptions;
import org.jclouds.blobstore.util.ForwardingBlobStore;
import org.jclouds.io.MutableContentMetadata;
import org.jclouds.io.Payload;
import org.jclouds.io.payloads.ByteSourcePayload;

public final class NullParts extends ForwardingBlobStore {
    private final Map<String, Long> partLengths = new ConcurrentHashMap<>();  // "uploadId/part" -> bytes received
    private final Map<String, Long> objectLengths = new ConcurrentHashMap<>();  // "container/key" -> completed length

    NullParts(BlobStore blobStore) {
        super(blobStore);
    }

    public static void main(String[] args) throws Exception {
        var properties = new Properties();
        try (InputStream in = Files.newInputStream(Paths.get(args[0]))) {
            properties.load(in);
        }
        BlobStoreContext context = ContextBuilder.newBuilder(properties.getProperty("jclouds.provider"))
                .credentials("", "").overrides(properties).build(BlobStoreContext.class);
        S3Proxy proxy = S3Proxy.Builder.fromProperties(properties).blobStore(new NullParts(context.getBlobStore())).build();
        proxy.start();
        System.err.println("braidbench.NullParts: s3proxy started, multipart data counted and discarded");
    }

    @Override
    public MultipartPart uploadMultipartPart(MultipartUpload mpu, int partNumber, Payload payload) {
        long length;
        try (InputStream in = payload.openStream()) {
            length = in.transferTo(OutputStream.nullOutputStream());
        } catch (IOException ioe) {
            throw new UncheckedIOException(ioe);
        }
        byte[] stub = Longs.toByteArray(length);
        var small = new ByteSourcePayload(ByteSource.wrap(stub));
        small.getContentMetadata().setContentLength((long) stub.length);
        MultipartPart part = super.uploadMultipartPart(mpu, partNumber, small);
        partLengths.put(mpu.id() + "/" + partNumber, length);
        return MultipartPart.create(partNumber, length, part.partETag(), part.lastModified());
    }

    @Override
    public List<MultipartPart> listMultipartUpload(MultipartUpload mpu) {
        var parts = new ArrayList<MultipartPart>();
        for (MultipartPart part : super.listMultipartUpload(mpu)) {
            long length = partLengths.getOrDefault(mpu.id() + "/" + part.partNumber(), part.partSize());
            parts.add(MultipartPart.create(part.partNumber(), length, part.partETag(), part.lastModified()));
        }
        return parts;
    }

    @Override
    public String completeMultipartUpload(MultipartUpload mpu, List<MultipartPart> parts) {
        long length = 0;
        for (MultipartPart part : parts) {
            Long received = partLengths.remove(mpu.id() + "/" + part.partNumber());
            length += received != null ? received : part.partSize();
        }
        String eTag = super.completeMultipartUpload(mpu, parts);
        objectLengths.put(mpu.containerName() + "/" + mpu.blobName(), length);
        return eTag;
    }

    @Override
    public void abortMultipartUpload(MultipartUpload mpu) {
        partLengths.keySet().removeIf(key -> key.startsWith(mpu.id() + "/"));
        super.abortMultipartUpload(mpu);
    }

    @Override
    public BlobMetadata blobMetadata(String container, String name) {
        BlobMetadata metadata = super.blobMetadata(container, name);
        Long length = objectLengths.get(container + "/" + name);
        if (metadata != null && length != null) {
            ((MutableBlobMetadata) metadata).setSize(length);
            ((MutableContentMetadata) metadata.getContentMetadata()).setContentLength(length);
        }
        return metadata;
    }

    @Override
    public Blob getBlob(String container, String name, GetOptions options) {
        Long length = objectLengths.get(container + "/" + name);
        Blob blob = super.getBlob(container, name, options);
        if (blob == null || length == null) {
            return blob;
        }
        var zeros = new ByteSourcePayload(new Zeros(length));  // ranges are not applied: the benchmark reads none
        zeros.setContentMetadata(blob.getPayload().getContentMetadata());
        zeros.getContentMetadata().setContentLength(length);
        zeros.getContentMetadata().setContentMD5((byte[]) null);
        blob.setPayload(zeros);
        blob.getMetadata().setSize(length);
        return blob;
    }

    @Override
    public Blob getBlob(String container, String name) {
        return getBlob(container, name, GetOptions.NONE);
    }

    @Override
    public void removeBlob(String container, String name) {
        objectLengths.remove(container + "/" + name);
        super.removeBlob(container, name);
    }

    private static final class Zeros extends ByteSource {
        private final long length;

        Zeros(long length) {
            this.length = length;
        }

        @Override
        public InputStream openStream() {
            return new InputStream() {
                private long left = length;

                @Override
                public int read() {
                    if (left <= 0) {
                        return -1;
                    }
                    left--;
                    return 0;
                }

                @Override
                public int read(byte[] buffer, int offset, int count) {
                    if (left <= 0) {
                        return -1;
                    }
                    int n = (int) Math.min(count, left);
                    Arrays.fill(buffer, offset, offset + n, (byte) 0);
                    left -= n;
                    return n;
                }
            };
        }
    }
}
