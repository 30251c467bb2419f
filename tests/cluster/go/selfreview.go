package main

// authentication.k8s.io/v1 SelfSubjectReview: a create-only resource, never stored,
// answered with the attributes of the user making the request (what `kubectl auth whoami`
// shows). Ported from Kubernetes v1.36
// pkg/registry/authentication/selfsubjectreview/rest.go.

import (
	"context"
	"fmt"

	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"
)

// selfSubjectReviewREST is the storage of SelfSubjectReviews.
type selfSubjectReviewREST struct{}

var (
	_ rest.Creater                  = &selfSubjectReviewREST{}
	_ rest.Scoper                   = &selfSubjectReviewREST{}
	_ rest.SingularNameProvider     = &selfSubjectReviewREST{}
	_ rest.GroupVersionKindProvider = &selfSubjectReviewREST{}
)

func (*selfSubjectReviewREST) New() runtime.Object {
	return &authenticationv1.SelfSubjectReview{}
}
func (*selfSubjectReviewREST) Destroy()                {}
func (*selfSubjectReviewREST) NamespaceScoped() bool   { return false }
func (*selfSubjectReviewREST) GetSingularName() string { return "selfsubjectreview" }
func (*selfSubjectReviewREST) GroupVersionKind(schema.GroupVersion) schema.GroupVersionKind {
	return authenticationv1.SchemeGroupVersion.WithKind("SelfSubjectReview")
}

// Create answers with the requesting user's name, UID, groups and extra.
func (*selfSubjectReviewREST) Create(ctx context.Context, obj runtime.Object, createValidation rest.ValidateObjectFunc, _ *metav1.CreateOptions) (runtime.Object, error) {
	review, ok := obj.(*authenticationv1.SelfSubjectReview)
	if !ok {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("not a SelfSubjectReview: %#v", obj))
	}
	if createValidation != nil {
		if err := createValidation(ctx, obj.DeepCopyObject()); err != nil {
			return nil, err
		}
	}
	u, ok := genericapirequest.UserFrom(ctx)
	if !ok {
		return nil, apierrors.NewBadRequest("no user present on request")
	}
	extra := map[string]authenticationv1.ExtraValue{}
	for k, v := range u.GetExtra() {
		extra[k] = v
	}
	review.Status = authenticationv1.SelfSubjectReviewStatus{UserInfo: authenticationv1.UserInfo{
		Username: u.GetName(), UID: u.GetUID(), Groups: u.GetGroups(), Extra: extra,
	}}
	return review, nil
}
