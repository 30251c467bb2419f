package main

// A stand-in for kube-apiserver's authentication of bound service-account tokens (the
// JWTs the kubelet mounts into a pod; k8s.io/kubernetes pkg/serviceaccount, which Debian
// does not package): --bound-service-account-tokens-file names a CSV file whose lines are
//
//	token,namespace,service account,pod name,pod UID,node name,node UID
//
// and a request bearing one of those tokens is the service account with the user
// information kube-apiserver gives a bound token's bearer, built by k8s.io/apiserver's own
// serviceaccount.ServiceAccountInfo.UserInfo: user system:serviceaccount:<ns>:<name>,
// groups system:serviceaccounts and system:serviceaccounts:<ns>, and in its extra the pod
// (authentication.kubernetes.io/pod-name, pod-uid) and the node it runs on
// (authentication.kubernetes.io/node-name, node-uid). What it does not do: tokens are
// opaque strings, not signed JWTs; nothing checks that the service account, pod or node
// exist, nor expiry or audiences; the user has no UID and no credential-id. The file is
// read at each token-bearing request, so a test can add tokens to a running server.

import (
	"context"
	"crypto/subtle"
	"encoding/csv"
	"fmt"
	"os"

	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/group"
	"k8s.io/apiserver/pkg/authentication/request/bearertoken"
	unionauth "k8s.io/apiserver/pkg/authentication/request/union"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	genericapiserver "k8s.io/apiserver/pkg/server"
)

// boundTokens authenticates the tokens of a --bound-service-account-tokens-file.
type boundTokens struct{ path string }

func (b boundTokens) AuthenticateToken(_ context.Context, token string) (*authenticator.Response, bool, error) {
	f, err := os.Open(b.path)
	if err != nil {
		return nil, false, err
	}
	defer f.Close()
	r := csv.NewReader(f)
	r.FieldsPerRecord = 7
	records, err := r.ReadAll()
	if err != nil {
		return nil, false, fmt.Errorf("%s: %w", b.path, err)
	}
	for _, rec := range records {
		if subtle.ConstantTimeCompare([]byte(rec[0]), []byte(token)) != 1 {
			continue
		}
		sa := &serviceaccount.ServiceAccountInfo{Namespace: rec[1], Name: rec[2], PodName: rec[3], PodUID: rec[4],
			NodeName: rec[5], NodeUID: rec[6]}
		return &authenticator.Response{User: sa.UserInfo()}, true, nil
	}
	return nil, false, nil
}

// addBoundTokens puts the bound-token stand-in before the configured authenticators
// (client certificates, then anonymous: k8s.io/apiserver's DelegatingAuthenticationOptions
// always adds anonymous last), failing the request on an unknown token: kube-apiserver
// answers one with 401 rather than taking it as anonymous
// (pkg/kubeapiserver/authenticator/config.go of Kubernetes v1.36 puts anonymous after the
// token authenticators with union.NewFailOnError).
func addBoundTokens(cfg *genericapiserver.AuthenticationInfo, path string) {
	tokens := group.NewAuthenticatedGroupAdder(bearertoken.New(boundTokens{path: path}))
	cfg.Authenticator = unionauth.NewFailOnError(tokens, cfg.Authenticator)
}
