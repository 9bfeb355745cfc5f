// The web page of `mzcache serve` (GET /: docs/server.md, "The page"): plain HTML, CSS and
// JavaScript from tools/serve/web/, compiled into the binary (cmake/embed_files.cmake makes a
// header of their bytes at build time). The page holds no data: it is served without the API key
// and asks the user for the key, which it sends as `Authorization: Bearer` to the API.
#pragma once
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace mz::serve {

struct WebAsset {
  const char* path;          // the request path: "/", "/app.js", ...
  const char* route;         // path as a regular expression, as httplib routes: /app\.js
  const char* content_type;  // with charset for text
  const unsigned char* data;
  size_t size;
};

// Every file of the page (static storage; never null).
const std::vector<WebAsset>& WebAssets();

// The headers every file of the page is served with: a Content-Security-Policy that allows only
// this origin's scripts, styles, images and API (no inline script or style, no other origin, no
// framing), nosniff, no referrer, no caching of a stale page after an upgrade.
const std::vector<std::pair<std::string, std::string>>& WebHeaders();

}  // namespace mz::serve
