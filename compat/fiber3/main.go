// Command fiber3 serves an orders endpoint behind the idempotency
// middleware of Fiber v3, with the middleware's defaults. Environment: PORT,
// DELAY_MS (how long creating an order takes, 100 by default), FAIL_MODE
// (how a request with X-Fail fails: "error", the default, returns an error
// to Fiber's error handler; "respond" answers 500 itself).
package main

import (
	"fmt"
	"log"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/gofiber/fiber/v3"
	"github.com/gofiber/fiber/v3/middleware/idempotency"
)

func main() {
	delay := 100 * time.Millisecond
	if ms, err := strconv.Atoi(os.Getenv("DELAY_MS")); err == nil {
		delay = time.Duration(ms) * time.Millisecond
	}
	respond := os.Getenv("FAIL_MODE") == "respond"

	app := fiber.New()
	app.Use(idempotency.New())
	var created atomic.Int64
	app.Post("/orders", func(c fiber.Ctx) error {
		if c.Get("X-Fail") != "" {
			if respond {
				return c.Status(fiber.StatusInternalServerError).JSON(fiber.Map{"error": "induced failure"})
			}
			return fiber.NewError(fiber.StatusInternalServerError, "induced failure")
		}
		time.Sleep(delay) // the work of creating an order
		id := created.Add(1)
		c.Location(fmt.Sprintf("/orders/%d", id))
		return c.Status(fiber.StatusCreated).JSON(fiber.Map{"id": id, "order": string(c.Body())})
	})
	log.Fatal(app.Listen("127.0.0.1:"+os.Getenv("PORT"), fiber.ListenConfig{DisableStartupMessage: true}))
}
