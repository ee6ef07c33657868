package exampleapp

import (
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"sync"
)

// Order is an order as the API answers it, in JSON.
type Order struct {
	ID       string `json:"id"`
	Account  string `json:"account"`
	Item     string `json:"item"`
	Quantity int    `json:"quantity"`
}

// Book holds the orders: the side effect that must happen once per key. A
// real API keeps them in its database. The zero Book is empty and ready to
// use; a Book is safe for concurrent use.
type Book struct {
	mu     sync.Mutex
	orders []Order
}

// Add creates an order for account and returns it. Its ID is "ord_" and its
// number in the book, from 1.
func (b *Book) Add(account, item string, quantity int) Order {
	b.mu.Lock()
	defer b.mu.Unlock()
	o := Order{ID: "ord_" + strconv.Itoa(len(b.orders)+1), Account: account, Item: item, Quantity: quantity}
	b.orders = append(b.orders, o)
	return o
}

// Get returns the order with the ID, and false if there is none or it is
// another account's.
func (b *Book) Get(account, id string) (Order, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, o := range b.orders {
		if o.ID == id && o.Account == account {
			return o, true
		}
	}
	return Order{}, false
}

// Count returns how many orders account has.
func (b *Book) Count(account string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, o := range b.orders {
		if o.Account == account {
			n++
		}
	}
	return n
}

// OrderRequest is the JSON body of POST /orders.
type OrderRequest struct {
	Item     string `json:"item"`
	Quantity int    `json:"quantity"`
}

// ErrInvalidOrder is the error of an order request without an item or
// without a positive quantity.
var ErrInvalidOrder = errors.New("exampleapp: want an item and a positive quantity")

// Validate returns ErrInvalidOrder if the request has no item or no positive
// quantity. A router that binds the body itself (gin, echo) calls it after.
func (req OrderRequest) Validate() error {
	if req.Item == "" || req.Quantity < 1 {
		return ErrInvalidOrder
	}
	return nil
}

// DecodeOrder reads an order request, in JSON, from r and validates it. The
// error is the decoder's, or ErrInvalidOrder.
func DecodeOrder(r io.Reader) (OrderRequest, error) {
	var req OrderRequest
	if err := json.NewDecoder(r).Decode(&req); err != nil {
		return OrderRequest{}, err
	}
	return req, req.Validate()
}
