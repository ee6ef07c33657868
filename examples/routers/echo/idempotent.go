package main

import (
	"github.com/labstack/echo/v4"

	"github.com/idemkit/idempotency/server"
)

// idempotent is echo.WrapMiddleware(mw.Handler), with two changes that the
// middleware needs because it stores the handler's response before the
// client sees it.
//
// echo.WrapMiddleware runs the handler inside the middleware with
// c.Request() and c.Response() set to the middleware's request and writer,
// which is what the middleware needs. But an echo handler may answer by
// returning an error, which echo renders (HTTPErrorHandler) only after the
// middleware chain has returned: by then the middleware has stored and sent
// an empty 200, and the rendered error goes nowhere. So the handler's error
// is rendered here, inside the middleware, with c.Error, and the adapter
// returns nil.
//
// And echo.WrapMiddleware leaves c.Response() set to the middleware's writer
// when it returns. A middleware before this one that writes after a panic
// (middleware.Recover) would then write to a response the middleware has
// finished with, and the client would get an empty 200. The adapter puts
// the request and response back on the way out, panics included, so that
// such middleware, and loggers, see the response that was actually sent.
func idempotent(mw *server.Middleware) echo.MiddlewareFunc {
	wrap := echo.WrapMiddleware(mw.Handler)
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		h := wrap(func(c echo.Context) error {
			if err := next(c); err != nil {
				c.Error(err)
			}
			return nil
		})
		return func(c echo.Context) error {
			req, res := c.Request(), c.Response()
			defer func() {
				c.SetRequest(req)
				c.SetResponse(res)
			}()
			return h(c)
		}
	}
}
