package controlplane.spark;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.KeyFactory;
import java.security.KeyStore;
import java.security.PrivateKey;
import java.security.cert.Certificate;
import java.security.cert.CertificateException;
import java.security.cert.CertificateFactory;
import java.security.spec.PKCS8EncodedKeySpec;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import java.util.function.Function;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import javax.net.ssl.KeyManager;
import javax.net.ssl.KeyManagerFactory;
import javax.net.ssl.SSLContext;
import javax.net.ssl.TrustManagerFactory;
import javax.net.ssl.X509ExtendedTrustManager;

/**
 * TLS from PEM files (a connection's CA, client certificate and key, from the certificate
 * directory): what the Cassandra writer and the schema registry's client build their contexts
 * from. Problems are a {@link TlsException} saying which file and what is wrong; each caller
 * says whose TLS it was.
 */
final class Tls {
  private Tls() {}

  /** A TLS file that cannot be used (the message names the setting and the problem). */
  static final class TlsException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    TlsException(String message, Throwable cause) {
      super(message, cause);
    }
  }

  private static final Pattern PEM =
      Pattern.compile("-----BEGIN ([A-Z0-9 ]+)-----([^-]*)-----END \\1-----");

  /**
   * A TLS context trusting the CAs of `caFile` (PEM; null: the JDK's own trust), presenting the
   * client certificate of `certFile` and `keyFile` if given; `wrap` (may be null) wraps each
   * trust manager (a host-name check of the caller's own).
   */
  static SSLContext context(String caFile, String certFile, String keyFile,
      Function<X509ExtendedTrustManager, X509ExtendedTrustManager> wrap) {
    try {
      CertificateFactory x509 = CertificateFactory.getInstance("X.509");
      TrustManagerFactory trusting =
          TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
      if (caFile != null) {
        KeyStore trust = KeyStore.getInstance(KeyStore.getDefaultType());
        trust.load(null, null);
        List<Certificate> authorities = certificates(x509, caFile, "tls.ca_file");
        for (int i = 0; i < authorities.size(); i++) {
          trust.setCertificateEntry("ca" + i, authorities.get(i));
        }
        trusting.init(trust);
      } else {
        trusting.init((KeyStore) null);
      }
      KeyManager[] keys = null;
      if (certFile != null) {
        List<Certificate> chain = certificates(x509, certFile, "tls.cert_file");
        PrivateKey key = privateKey(read(keyFile, "tls.key_file"));
        KeyStore store = KeyStore.getInstance(KeyStore.getDefaultType());
        store.load(null, null);
        store.setKeyEntry("client", key, new char[0], chain.toArray(new Certificate[0]));
        KeyManagerFactory keying =
            KeyManagerFactory.getInstance(KeyManagerFactory.getDefaultAlgorithm());
        keying.init(store, new char[0]);
        keys = keying.getKeyManagers();
      }
      javax.net.ssl.TrustManager[] trustManagers = trusting.getTrustManagers();
      if (wrap != null) {
        for (int i = 0; i < trustManagers.length; i++) {
          if (trustManagers[i] instanceof X509ExtendedTrustManager) {
            trustManagers[i] = wrap.apply((X509ExtendedTrustManager) trustManagers[i]);
          }
        }
      }
      SSLContext context = SSLContext.getInstance("TLS");
      context.init(keys, trustManagers, null);
      return context;
    } catch (GeneralSecurityException | IOException e) {
      throw new TlsException(describe(e), e);
    }
  }

  static String read(String path, String key) {
    try {
      return Files.readString(Path.of(path), StandardCharsets.US_ASCII);
    } catch (IOException | RuntimeException e) {
      throw new TlsException(key + " " + path + " cannot be read: " + describe(e), e);
    }
  }

  static List<Certificate> certificates(CertificateFactory x509, String path, String key)
      throws CertificateException {
    List<Certificate> out = new ArrayList<>();
    Matcher pem = PEM.matcher(read(path, key));
    while (pem.find()) {
      if (pem.group(1).equals("CERTIFICATE")) {
        byte[] der = Base64.getMimeDecoder().decode(pem.group(2));
        out.add(x509.generateCertificate(new java.io.ByteArrayInputStream(der)));
      }
    }
    if (out.isEmpty()) {
      throw new TlsException(key + " " + path + " holds no PEM certificate", null);
    }
    return out;
  }

  /** A PEM private key: PKCS#8 (RSA, EC, Ed25519) or PKCS#1 RSA; not encrypted. */
  static PrivateKey privateKey(String text) throws GeneralSecurityException {
    Matcher pem = PEM.matcher(text);
    while (pem.find()) {
      String kind = pem.group(1);
      byte[] der = Base64.getMimeDecoder().decode(pem.group(2));
      if (kind.equals("RSA PRIVATE KEY")) {
        return KeyFactory.getInstance("RSA").generatePrivate(
            new PKCS8EncodedKeySpec(pkcs8OfPkcs1(der)));
      }
      if (kind.equals("PRIVATE KEY")) {
        for (String algorithm : new String[] {"RSA", "EC", "Ed25519", "Ed448", "DSA"}) {
          try {
            return KeyFactory.getInstance(algorithm).generatePrivate(new PKCS8EncodedKeySpec(der));
          } catch (GeneralSecurityException e) {
            // the next one
          }
        }
        throw new TlsException("tls.key_file's key is of no known algorithm", null);
      }
      if (kind.equals("ENCRYPTED PRIVATE KEY") || kind.equals("EC PRIVATE KEY")) {
        throw new TlsException("tls.key_file holds an " + kind
            + "; convert it to unencrypted PKCS#8 (openssl pkcs8 -topk8 -nocrypt)", null);
      }
    }
    throw new TlsException("tls.key_file holds no PEM private key", null);
  }

  /** PKCS#1 RSAPrivateKey wrapped as PKCS#8 PrivateKeyInfo (rsaEncryption, NULL params). */
  static byte[] pkcs8OfPkcs1(byte[] pkcs1) {
    byte[] version = {0x02, 0x01, 0x00};
    byte[] algorithm = {0x30, 0x0d, 0x06, 0x09, 0x2a, (byte) 0x86, 0x48, (byte) 0x86,
        (byte) 0xf7, 0x0d, 0x01, 0x01, 0x01, 0x05, 0x00};
    byte[] key = der(0x04, pkcs1);
    ByteArrayOutputStream body = new ByteArrayOutputStream();
    body.writeBytes(version);
    body.writeBytes(algorithm);
    body.writeBytes(key);
    return der(0x30, body.toByteArray());
  }

  private static byte[] der(int tag, byte[] content) {
    ByteArrayOutputStream out = new ByteArrayOutputStream();
    out.write(tag);
    int n = content.length;
    if (n < 0x80) {
      out.write(n);
    } else {
      int bytes = n > 0xffffff ? 4 : n > 0xffff ? 3 : n > 0xff ? 2 : 1;
      out.write(0x80 | bytes);
      for (int i = bytes - 1; i >= 0; i--) {
        out.write((n >>> (8 * i)) & 0xff);
      }
    }
    out.writeBytes(content);
    return out.toByteArray();
  }

  private static String describe(Throwable e) {
    String message = e.getMessage();
    return e.getClass().getSimpleName() + (message == null ? "" : ": " + message);
  }
}
