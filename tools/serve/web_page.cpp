// The web page's files and headers (tools/serve/web_page.h).
#include "tools/serve/web_page.h"

#include "serve_web_assets.h"  // generated from tools/serve/web/ (cmake/embed_files.cmake)

namespace mz::serve {

const std::vector<WebAsset>& WebAssets() {
  static const std::vector<WebAsset> assets = {
      {"/", "/", "text/html; charset=utf-8", web::index_html, web::index_html_size},
      {"/app.js", R"(/app\.js)", "text/javascript; charset=utf-8", web::app_js, web::app_js_size},
      {"/style.css", R"(/style\.css)", "text/css; charset=utf-8", web::style_css, web::style_css_size},
      {"/favicon.svg", R"(/favicon\.svg)", "image/svg+xml", web::favicon_svg, web::favicon_svg_size},
  };
  return assets;
}

const std::vector<std::pair<std::string, std::string>>& WebHeaders() {
  static const std::vector<std::pair<std::string, std::string>> headers = {
      {"Content-Security-Policy",
       "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"},
      {"X-Content-Type-Options", "nosniff"},
      {"Referrer-Policy", "no-referrer"},
      {"X-Frame-Options", "DENY"},
      {"Cache-Control", "no-cache"},
  };
  return headers;
}

}  // namespace mz::serve
