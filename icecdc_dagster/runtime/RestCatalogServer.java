/*
 * A small Iceberg REST catalog for local trials and tests: the JDK's HTTP server in front of
 * Iceberg's CatalogHandlers (which implement each catalog operation of the REST spec over any
 * Catalog), with a JdbcCatalog on one SQLite file behind them. Compiled and started by
 * icecdc_dagster.runtime.rest_server (`icecdc rest-server`); nothing here is needed to *use* a REST
 * catalog, only to have one.
 *
 * Options: --db FILE --warehouse URI [--port N] [--host H] [--name NAME] [--prefix P]
 *          [--header NAME=VALUE]...; environment: ICECDC_REST_TOKEN, ICECDC_REST_CREDENTIAL.
 * The catalog NAME answers at http://host:port/v1/...; any other catalog at http://host:port/<c>/v1/...
 * (created on first use, its tables under <warehouse>/<c>): one server, as many catalogs as trials.
 * With a token every request needs "Authorization: Bearer <token>"; a credential (ID:SECRET) lets a
 * client obtain it from /v1/oauth/tokens (client_credentials); --prefix puts every route under
 * /v1/P/; each --header must come with every catalog request. It prints "listening on URL" once
 * it serves.
 */
package icecdc.rest;

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import java.io.IOException;
import java.io.InputStream;
import java.net.InetSocketAddress;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.Executors;
import java.util.concurrent.locks.Lock;
import java.util.concurrent.locks.ReentrantReadWriteLock;
import org.apache.hadoop.conf.Configuration;
import org.apache.iceberg.CatalogProperties;
import org.apache.iceberg.catalog.Namespace;
import org.apache.iceberg.catalog.TableIdentifier;
import org.apache.iceberg.exceptions.AlreadyExistsException;
import org.apache.iceberg.exceptions.CommitFailedException;
import org.apache.iceberg.exceptions.ForbiddenException;
import org.apache.iceberg.exceptions.NamespaceNotEmptyException;
import org.apache.iceberg.exceptions.NoSuchNamespaceException;
import org.apache.iceberg.exceptions.NoSuchTableException;
import org.apache.iceberg.exceptions.NotAuthorizedException;
import org.apache.iceberg.exceptions.ValidationException;
import org.apache.iceberg.jdbc.JdbcCatalog;
import org.apache.iceberg.rest.CatalogHandlers;
import org.apache.iceberg.rest.Endpoint;
import org.apache.iceberg.rest.RESTSerializers;
import org.apache.iceberg.rest.RESTUtil;
import org.apache.iceberg.rest.requests.CreateNamespaceRequest;
import org.apache.iceberg.rest.requests.CreateTableRequest;
import org.apache.iceberg.rest.requests.RegisterTableRequest;
import org.apache.iceberg.rest.requests.RenameTableRequest;
import org.apache.iceberg.rest.requests.UpdateNamespacePropertiesRequest;
import org.apache.iceberg.rest.requests.UpdateTableRequest;
import org.apache.iceberg.rest.responses.ConfigResponse;
import org.apache.iceberg.rest.responses.ErrorResponse;
import org.apache.iceberg.rest.responses.OAuthTokenResponse;
import org.apache.iceberg.shaded.com.fasterxml.jackson.annotation.JsonAutoDetect;
import org.apache.iceberg.shaded.com.fasterxml.jackson.annotation.PropertyAccessor;
import org.apache.iceberg.shaded.com.fasterxml.jackson.databind.DeserializationFeature;
import org.apache.iceberg.shaded.com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.iceberg.shaded.com.fasterxml.jackson.databind.PropertyNamingStrategies;

public final class RestCatalogServer {
  /** The routes served, as the config response advertises them. */
  private static final List<Endpoint> ENDPOINTS = Arrays.asList(
      Endpoint.V1_LIST_NAMESPACES, Endpoint.V1_LOAD_NAMESPACE, Endpoint.V1_NAMESPACE_EXISTS,
      Endpoint.V1_CREATE_NAMESPACE, Endpoint.V1_UPDATE_NAMESPACE, Endpoint.V1_DELETE_NAMESPACE,
      Endpoint.V1_LIST_TABLES, Endpoint.V1_LOAD_TABLE, Endpoint.V1_TABLE_EXISTS, Endpoint.V1_CREATE_TABLE,
      Endpoint.V1_UPDATE_TABLE, Endpoint.V1_DELETE_TABLE, Endpoint.V1_RENAME_TABLE,
      Endpoint.V1_REGISTER_TABLE, Endpoint.V1_REPORT_METRICS);

  /** JSON as the REST spec writes it: kebab-case fields, Iceberg's serializers for its own types. */
  private static final ObjectMapper JSON = new ObjectMapper()
      .setVisibility(PropertyAccessor.FIELD, JsonAutoDetect.Visibility.ANY)
      .configure(DeserializationFeature.FAIL_ON_UNKNOWN_PROPERTIES, false)
      .setPropertyNamingStrategy(PropertyNamingStrategies.KEBAB_CASE);

  static {
    RESTSerializers.registerAll(JSON);
  }

  private final Map<String, JdbcCatalog> catalogs = new HashMap<>();
  private final Map<String, String> options;
  private final Map<String, String> requiredHeaders;
  // SQLite takes one writer at a time: commits are serialised here rather than retried on SQLITE_BUSY.
  private final ReentrantReadWriteLock lock = new ReentrantReadWriteLock();

  private RestCatalogServer(Map<String, String> options, Map<String, String> requiredHeaders) {
    this.options = options;
    this.requiredHeaders = requiredHeaders;
  }

  /** A failed request: its HTTP status and the exception type named in the error response. */
  private static final class HttpError extends RuntimeException {
    private final int status;
    private final String type;

    HttpError(int status, String type, String message) {
      super(message);
      this.status = status;
      this.type = type;
    }
  }

  /** One request: catalog, method, path segments after /v1/[prefix/], query parameters, body. */
  private static final class Call {
    final String catalog;
    final String method;
    final List<String> path;
    final Map<String, String> query;
    final String body;

    Call(String catalog, String method, List<String> path, Map<String, String> query, String body) {
      this.catalog = catalog;
      this.method = method;
      this.path = path;
      this.query = query;
      this.body = body;
    }

    /** The route's shape, e.g. "POST namespaces/{}/tables/{}": literal segments kept, names replaced. */
    String shape() {
      List<String> parts = new ArrayList<>(path);
      if ("namespaces".equals(parts.get(0)) && parts.size() > 1) {
        parts.set(1, "{}");
        if (parts.size() > 3 && "tables".equals(parts.get(2))) {
          parts.set(3, "{}");
        }
      }
      return method + " " + String.join("/", parts);
    }

    Namespace namespace() {
      return RESTUtil.decodeNamespace(path.get(1));
    }

    TableIdentifier table() {
      return TableIdentifier.of(namespace(), RESTUtil.decodeString(path.get(3)));
    }

    <T> T read(Class<T> type) throws IOException {
      return JSON.readValue(body, type);
    }
  }

  public static void main(String[] args) throws IOException {
    Map<String, String> options = new HashMap<>();
    Map<String, String> headers = new LinkedHashMap<>();
    for (int i = 0; i + 1 < args.length; i += 2) {
      if ("--header".equals(args[i])) {
        String[] kv = args[i + 1].split("=", 2);
        headers.put(kv[0].toLowerCase(), kv.length > 1 ? kv[1] : "");
      } else {
        options.put(args[i].replaceFirst("^--", ""), args[i + 1]);
      }
    }
    for (String name : new String[] {"token", "credential"}) {
      String value = System.getenv("ICECDC_REST_" + name.toUpperCase());
      if (value != null && !value.isEmpty()) {
        options.put(name, value);
      }
    }
    required(options, "db");
    required(options, "warehouse");
    RestCatalogServer router = new RestCatalogServer(options, headers);
    router.createTables();  // a bad --db fails now, not at the first request
    int port = Integer.parseInt(options.getOrDefault("port", "0"));
    HttpServer server = HttpServer.create(new InetSocketAddress(options.getOrDefault("host", "127.0.0.1"), port), 64);
    server.createContext("/", router::serve);
    server.setExecutor(Executors.newFixedThreadPool(8));
    server.start();
    System.out.println("listening on http://" + options.getOrDefault("host", "127.0.0.1") + ":"
        + server.getAddress().getPort());
    System.out.flush();
  }

  /** The catalog served under /<name>/v1 (the default one for ""), created on first use. */
  private synchronized JdbcCatalog catalog(String name) {
    return catalogs.computeIfAbsent(name, key -> {
      String warehouse = options.get("warehouse").replaceFirst("/+$", "");
      return jdbcCatalog(key.isEmpty() ? options.getOrDefault("name", "rest") : key,
          key.isEmpty() ? warehouse : warehouse + "/" + key, false);
    });
  }

  private JdbcCatalog jdbcCatalog(String name, String warehouse, boolean createTables) {
    JdbcCatalog catalog = new JdbcCatalog();
    catalog.setConf(new Configuration());
    Map<String, String> properties = new HashMap<>();
    properties.put(CatalogProperties.URI, "jdbc:sqlite:" + options.get("db"));
    properties.put(CatalogProperties.WAREHOUSE_LOCATION, warehouse);
    properties.put("jdbc.schema-version", "V1");
    // JdbcCatalog's start-up check of its tables leaves a SQLite read lock open on a pooled connection,
    // and every later write from another connection fails with SQLITE_BUSY: the tables are created once
    // by a catalog closed at once (see createTables), and no serving catalog checks them.
    properties.put("jdbc.init-catalog-tables", String.valueOf(createTables));
    catalog.initialize(name, properties);
    return catalog;
  }

  /** Create the catalog tables (when missing) and release the connection that did it. */
  private void createTables() throws IOException {
    jdbcCatalog("icecdc_bootstrap", options.get("warehouse"), true).close();
  }

  private static String required(Map<String, String> options, String name) {
    String value = options.get(name);
    if (value == null) {
      throw new IllegalArgumentException("missing --" + name);
    }
    return value;
  }

  private void serve(HttpExchange exchange) throws IOException {
    int status;
    Object response = null;
    try {
      Call call = parse(exchange);
      authorise(exchange, call);
      Lock held = "GET".equals(call.method) || "HEAD".equals(call.method)
          ? lock.readLock() : lock.writeLock();
      held.lock();
      try {
        response = route(call);
      } finally {
        held.unlock();
      }
      status = response == null ? 204 : 200;
    } catch (HttpError e) {
      status = e.status;
      response = error(status, e.type, e.getMessage());
    } catch (RuntimeException e) {
      status = statusOf(e);
      response = error(status, e.getClass().getSimpleName(), String.valueOf(e.getMessage()));
      if (status == 500) {
        e.printStackTrace();
      }
    }
    send(exchange, status, response);
  }

  private Call parse(HttpExchange exchange) throws IOException {
    String raw = exchange.getRequestURI().getRawPath();
    int v1 = raw.indexOf("/v1/");
    String catalogName = v1 > 0 ? raw.substring(1, v1) : "";
    if (v1 < 0 || !catalogName.matches("[A-Za-z0-9_-]*")) {
      throw new HttpError(404, "NotFoundException", "no route for " + raw + " (expected [/<catalog>]/v1/...)");
    }
    List<String> path = new ArrayList<>(Arrays.asList(raw.substring(v1 + 4).split("/")));
    String prefix = options.get("prefix");
    boolean unprefixed = path.get(0).equals("config") || path.get(0).equals("oauth");
    if (prefix != null && !unprefixed) {
      if (!path.get(0).equals(prefix)) {
        throw new HttpError(404, "NotFoundException", "no route for " + raw + " (this catalog's prefix is " + prefix + ")");
      }
      path.remove(0);
    }
    Map<String, String> query = new HashMap<>();
    String rawQuery = exchange.getRequestURI().getRawQuery();
    if (rawQuery != null) {
      for (String pair : rawQuery.split("&")) {
        String[] kv = pair.split("=", 2);
        query.put(decode(kv[0]), kv.length > 1 ? decode(kv[1]) : "");
      }
    }
    String body;
    try (InputStream in = exchange.getRequestBody()) {
      body = new String(in.readAllBytes(), StandardCharsets.UTF_8);
    }
    return new Call(catalogName, exchange.getRequestMethod(), path, query, body);
  }

  private static String decode(String text) {
    return URLDecoder.decode(text, StandardCharsets.UTF_8);
  }

  private void authorise(HttpExchange exchange, Call call) {
    if (call.path.equals(List.of("oauth", "tokens"))) {
      return;
    }
    for (Map.Entry<String, String> header : requiredHeaders.entrySet()) {
      if (!header.getValue().equals(exchange.getRequestHeaders().getFirst(header.getKey()))) {
        throw new HttpError(403, "ForbiddenException", "header " + header.getKey() + " missing or wrong");
      }
    }
    String token = options.get("token");
    if (token != null && !("Bearer " + token).equals(exchange.getRequestHeaders().getFirst("Authorization"))) {
      throw new HttpError(401, "NotAuthorizedException", "a bearer token is required");
    }
  }

  private Object route(Call call) throws IOException {
    JdbcCatalog catalog = catalog(call.catalog);
    switch (call.shape()) {
      case "GET config":
        return ConfigResponse.builder().withEndpoints(ENDPOINTS).build();
      case "POST oauth/tokens":
        return token(RESTUtil.decodeFormData(call.body));
      case "GET namespaces":
        Namespace parent = call.query.containsKey("parent")
            ? RESTUtil.decodeNamespace(call.query.get("parent")) : Namespace.empty();
        return CatalogHandlers.listNamespaces(catalog, parent);
      case "POST namespaces":
        return CatalogHandlers.createNamespace(catalog, call.read(CreateNamespaceRequest.class));
      case "GET namespaces/{}":
        return CatalogHandlers.loadNamespace(catalog, call.namespace());
      case "HEAD namespaces/{}":
        CatalogHandlers.namespaceExists(catalog, call.namespace());
        return null;
      case "DELETE namespaces/{}":
        CatalogHandlers.dropNamespace(catalog, call.namespace());
        return null;
      case "POST namespaces/{}/properties":
        return CatalogHandlers.updateNamespaceProperties(
            catalog, call.namespace(), call.read(UpdateNamespacePropertiesRequest.class));
      case "GET namespaces/{}/tables":
        return CatalogHandlers.listTables(catalog, call.namespace());
      case "POST namespaces/{}/tables":
        CreateTableRequest create = call.read(CreateTableRequest.class);
        create.validate();
        return create.stageCreate()
            ? CatalogHandlers.stageTableCreate(catalog, call.namespace(), create)
            : CatalogHandlers.createTable(catalog, call.namespace(), create);
      case "POST namespaces/{}/register":
        return CatalogHandlers.registerTable(catalog, call.namespace(), call.read(RegisterTableRequest.class));
      case "GET namespaces/{}/tables/{}":
        return CatalogHandlers.loadTable(catalog, call.table());
      case "HEAD namespaces/{}/tables/{}":
        CatalogHandlers.tableExists(catalog, call.table());
        return null;
      case "POST namespaces/{}/tables/{}":
        return CatalogHandlers.updateTable(catalog, call.table(), call.read(UpdateTableRequest.class));
      case "DELETE namespaces/{}/tables/{}":
        if (Boolean.parseBoolean(call.query.getOrDefault("purgeRequested", "false"))) {
          CatalogHandlers.purgeTable(catalog, call.table());
        } else {
          CatalogHandlers.dropTable(catalog, call.table());
        }
        return null;
      case "POST namespaces/{}/tables/{}/metrics":
        return null;  // metrics reports are accepted and dropped
      case "POST tables/rename":
        CatalogHandlers.renameTable(catalog, call.read(RenameTableRequest.class));
        return null;
      default:
        throw new HttpError(400, "BadRequestException", "no route for " + call.shape());
    }
  }

  private OAuthTokenResponse token(Map<String, String> form) {
    String credential = options.get("credential");
    String given = form.getOrDefault("client_id", "") + ":" + form.getOrDefault("client_secret", "");
    if (credential == null || !credential.equals(given) || !"client_credentials".equals(form.get("grant_type"))) {
      throw new HttpError(401, "NotAuthorizedException", "unknown client credential");
    }
    return OAuthTokenResponse.builder().withToken(options.getOrDefault("token", "icecdc-local"))
        .withTokenType("bearer").withIssuedTokenType("urn:ietf:params:oauth:token-type:access_token").build();
  }

  private static int statusOf(RuntimeException e) {
    if (e instanceof NoSuchTableException || e instanceof NoSuchNamespaceException) {
      return 404;
    }
    if (e instanceof AlreadyExistsException || e instanceof CommitFailedException
        || e instanceof NamespaceNotEmptyException) {
      return 409;
    }
    if (e instanceof NotAuthorizedException) {
      return 401;
    }
    if (e instanceof ForbiddenException) {
      return 403;
    }
    if (e instanceof IllegalArgumentException || e instanceof ValidationException) {
      return 400;
    }
    if (e instanceof UnsupportedOperationException) {
      return 406;
    }
    return 500;
  }

  private static ErrorResponse error(int status, String type, String message) {
    return ErrorResponse.builder().responseCode(status).withType(type).withMessage(message).build();
  }

  private static void send(HttpExchange exchange, int status, Object response) throws IOException {
    boolean noBody = response == null || "HEAD".equals(exchange.getRequestMethod());
    byte[] bytes = noBody ? new byte[0] : JSON.writeValueAsBytes(response);
    if (!noBody) {
      exchange.getResponseHeaders().set("Content-Type", "application/json");
    }
    exchange.sendResponseHeaders(status == 200 && noBody ? 204 : status, noBody ? -1 : bytes.length);
    if (!noBody) {
      exchange.getResponseBody().write(bytes);
    }
    exchange.close();
  }
}
